"""``snip export RUN --format hf``: a checkpoint becomes a transformers Llama with equal logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from snip.cli import main  # noqa: E402
from snip.models import ModelConfig, build_model  # noqa: E402
from snip.models.hf import from_hf_llama, tiny_hf_model, to_hf_llama  # noqa: E402
from snip.train import checkpoint  # noqa: E402

CFG = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=256, ffn_hidden=192,
           max_seq_len=128, rope_theta=500000.0, norm_eps=1e-6)


def _trained_like(tie: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(ModelConfig(**CFG, tie_embeddings=tie))
    with torch.no_grad():  # move the norms off 1.0 so a dropped norm weight would show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def _fake_run(root: Path, model: torch.nn.Module) -> Path:
    run = root / "run"
    opt = torch.optim.AdamW(model.parameters())
    checkpoint.save(run / "checkpoints", 7, model=model, optimizer=opt,
                    plan={"version": 1, "default": dict.fromkeys(("fprop", "dgrad", "wgrad"),
                                                                  "mxfp4")},
                    config_toml="", meta=checkpoint.Meta(model=model.config.to_dict(),
                                                         tokenizer="byte", vocab_size=256))
    return run


@pytest.mark.parametrize("tie", [False, True])
def test_export_hf_loads_in_transformers_with_matching_logits(tmp_path, capsys, tie):
    model = _trained_like(tie).eval()
    run = _fake_run(tmp_path, model)
    out = tmp_path / "hf"
    assert main(["export", str(run), "--format", "hf", "--out", str(out)]) == 0
    shown = capsys.readouterr()
    assert "exported" in shown.out
    # transformers' shard bar only on a terminal (a log got "Writing model shards: 0%..."),
    # and its setting put back for the rest of the process
    assert shown.err == "" and transformers.utils.logging.is_progress_bar_enabled()
    assert {"config.json", "model.safetensors", "snip_export.json"} <= {
        p.name for p in out.iterdir()}
    assert json.loads((out / "snip_export.json").read_text())["step"] == 7
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf).__name__ == "LlamaForCausalLM"
    assert hf.config.rope_parameters["rope_theta"] == 500000.0
    tokens = torch.randint(0, 256, (2, 50), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, _ = model(tokens)
        # transformers' Llama on the exported weights vs ours: the same math in other op orders
        # (measured 0 on a Xeon, ~1e-6 at most through 2 blocks); 1e-5 is 10x that
        torch.testing.assert_close(hf(tokens).logits, ours, rtol=0, atol=1e-5)


def test_round_trip_hf_snip_hf_is_exact():
    hf = tiny_hf_model("llama")
    back = to_hf_llama(from_hf_llama(hf))
    for k, v in hf.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k


def test_export_without_checkpoint_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "o")]) == 2
    assert "has no checkpoints" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"RUN: {tmp_path / 'nope'} does not exist" in err and "--resume" not in err
