"""`snip train --writeback.*`: the safe weight write-back (snip.optim) inside the trainer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from snip.cli import main
from snip.formats import cast
from snip.models import build_model
from snip.optim import DEFAULT_TILE_SIZE, Policy, eligible_parameters, full_mask
from snip.train import checkpoint, from_sources, train
from snip.train import config as C

WB = {"writeback.policy": "stochastic", "writeback.format": "e4m3", "precision.mode": "fixed"}


def _argv(overrides: dict[str, object]) -> list[str]:
    return [a for k, v in overrides.items() for a in (f"--{k}", str(v))]


def _train_events(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == "train"]


# ---- config ------------------------------------------------------------------------------------

def test_section_mirrors_snip_optim() -> None:
    assert C.WRITEBACK_POLICIES[1:] == tuple(p.value for p in Policy)
    assert C.WritebackSection().tile_size == DEFAULT_TILE_SIZE
    assert C.WritebackSection().policy is C.WritebackPolicy.NONE


@pytest.mark.parametrize("values, match", [
    ({"writeback.policy": "sr"}, "writeback.policy must be one of none, rne, stochastic"),
    ({"writeback.policy": "rne", "writeback.format": "e9"}, "writeback.format: unknown storage"),
    ({"writeback.policy": "rne", "writeback.state_format": "q7"}, "writeback.state_format"),
    ({"writeback.state_format": "bf16"}, "writeback.state_format needs a writeback.policy"),
    ({"writeback.policy": "rne", "writeback.tile_size": 0}, "writeback.tile_size must be > 0"),
    ({"writeback.policy": "selective_master"}, "writeback.mask is required by policy"),
    ({"writeback.policy": "rne", "writeback.mask": "m.json"}, "only applies to .*selective"),
])
def test_bad_writeback_values_name_the_key(values: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        C.build(values)


def test_the_library_config_names_its_own_fields() -> None:
    from snip.optim import WritebackConfig

    with pytest.raises(ValueError, match=r"^tile_size must be > 0"):
        WritebackConfig(tile_size=0)
    with pytest.raises(ValueError, match=r"^mask is required by policy 'selective_master'"):
        WritebackConfig(policy="selective_master")


def test_help_documents_the_writeback_options(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    for flag in ("policy", "format", "mask", "tile_size", "state_format"):
        assert f"--writeback.{flag}" in out


# ---- the trainer -------------------------------------------------------------------------------

def test_stochastic_e4m3_run_end_to_end(tiny: dict) -> None:
    argv = _argv({**tiny, **WB, "train.steps": 6, "train.ckpt_every": 3,
                  "train.eval_every": 6})
    assert main(["train", *argv]) == 0
    run = Path(tiny["run.dir"]) / "tiny"
    events = _train_events(run)
    assert [e["step"] for e in events] == list(range(1, 7))
    for e in events:
        assert 0.0 <= e["writeback_never_moved"] <= e["writeback_frozen"] <= 1.0
    ckpt = checkpoint.load(checkpoint.find(run))
    assert ckpt.writeback is not None and ckpt.writeback["policy"] == "stochastic"
    assert ckpt.writeback["step"] == 6
    # the managed weights are stored on the e4m3 grid, the embedding is not
    weights = load_file(ckpt.path / "model.safetensors")
    w = weights["layers.0.attention.wq.weight"]
    assert torch.equal(cast(w, "e4m3"), w)
    emb = weights["tok_embeddings.weight"]
    assert not torch.equal(cast(emb, "e4m3"), emb)


def test_resume_with_writeback_is_bit_exact(tiny: dict, ctrl_c_after) -> None:
    base = {**tiny, **WB, "writeback.state_format": "bf16"}
    full = train(from_sources(overrides={**base, "run.name": "full"}))
    assert full.step == 12

    with ctrl_c_after(5):
        cut = train(from_sources(overrides={**base, "run.name": "cut"}))
    assert cut.interrupted and cut.step == 5

    run_dir = Path(tiny["run.dir"]) / "cut"
    with pytest.raises(ValueError, match="--resume cannot change writeback.policy"):
        train(from_sources(resume=run_dir, overrides={"writeback.policy": "none",
                                                      "writeback.state_format": ""}),
              resume=run_dir)
    resumed = train(from_sources(resume=run_dir), resume=run_dir)
    assert resumed.losses == {s: v for s, v in full.losses.items() if s > 5}  # bit for bit
    keys = ("step", "loss", "writeback_frozen", "writeback_never_moved")
    audit = [{k: e[k] for k in keys} for e in _train_events(run_dir)]
    assert audit == [{k: e[k] for k in keys} for e in _train_events(Path(full.run_dir))]


def test_selective_master_without_mask_is_a_one_line_error(
        tiny: dict, capsys: pytest.CaptureFixture) -> None:
    assert main(["train", *_argv({**tiny, "writeback.policy": "selective_master"})]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "writeback.mask" in err and "selective_master" in err
    assert not (Path(tiny["run.dir"]) / "tiny").exists()


def test_mask_for_another_model_is_rejected(tiny: dict, tmp_path: Path,
                                            capsys: pytest.CaptureFixture) -> None:
    other = {n: p.shape for n, p in eligible_parameters(build_model("small"))}
    mask = full_mask(other).save(tmp_path / "small_mask.json")
    argv = _argv({**tiny, "precision.mode": "fixed", "writeback.policy": "selective_master",
                  "writeback.mask": mask})
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "made for a different model" in err
    assert not (Path(tiny["run.dir"]) / "tiny" / "checkpoints").exists()
