"""The whole Hugging Face round trip: checkpoints carry their tokenizer, exports load with
``AutoTokenizer`` and ``pipeline``, ``snip train --init-from-hf`` continues an HF model, and
``SnipCallback`` re-plans (and resumes its plans) inside a transformers training loop."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

transformers = pytest.importorskip("transformers")

from snip.cli import main  # noqa: E402
from snip.data import BPETokenizer, ByteTokenizer  # noqa: E402
from snip.errors import UserError  # noqa: E402
from snip.train import checkpoint, from_sources, train  # noqa: E402

TEXT = "def main(argv):\n    return sorted(set(argv), key=len)  # héllo ✓\n"


def _run(tiny: dict, **extra: object) -> Path:
    train(from_sources(overrides={**tiny, "train.steps": 4, "train.eval_every": 4,
                                  "train.ckpt_every": 4, **extra}))
    return Path(str(tiny["run.dir"])) / str(extra.get("run.name", tiny["run.name"]))


def test_byte_export_loads_with_autotokenizer_and_pipeline(tiny: dict, tmp_path: Path) -> None:
    run = _run(tiny)
    ckpt = checkpoint.find(run)
    assert (ckpt / checkpoint.TOKENIZER_FILE).is_file()
    assert isinstance(checkpoint.tokenizer_of(ckpt), ByteTokenizer)
    out = tmp_path / "hf"
    assert main(["export", str(run), "--out", str(out)]) == 0
    weights, config = (out / "model.safetensors").stat(), (out / "config.json").stat()
    assert weights.st_mode & 0o777 == config.st_mode & 0o777  # not 0600 beside 0644
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok(TEXT)["input_ids"] == list(TEXT.encode("utf-8"))  # ids = the UTF-8 bytes
    assert tok.decode(list(TEXT.encode("utf-8"))) == TEXT
    gen = transformers.pipeline("text-generation", str(out))
    text = gen("def ", max_new_tokens=5, do_sample=False)[0]["generated_text"]
    assert text.startswith("def ")


def test_bpe_checkpoint_carries_its_tokenizer_and_exports_it(tiny: dict, corpus: Path,
                                                            tmp_path: Path, capsys) -> None:
    """A BPE run: the checkpoint keeps working after the tokenizer file and the corpus are
    gone (export, `snip sample`'s tokenizer), and the export's tokenizer gives our ids."""
    text = tmp_path / "corpus.txt"
    shutil.copy(corpus, text)
    bpe = BPETokenizer.train([text.read_text()], vocab_size=300)
    bpe.save(tmp_path / "bpe.json")
    run = _run(tiny, **{"data.path": str(text), "data.tokenizer": str(tmp_path / "bpe.json"),
                        "run.name": "bpe"})
    (tmp_path / "bpe.json").unlink()
    text.unlink()
    ckpt = checkpoint.find(run)
    held = checkpoint.tokenizer_of(ckpt)
    assert isinstance(held, BPETokenizer) and held.encode(TEXT) == bpe.encode(TEXT)
    capsys.readouterr()
    # sample needs no corpus; eval of another corpus uses the checkpoint's tokenizer copy
    assert main(["sample", str(run), "--prompt", "def ", "--tokens", "4",
                 "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith("def ")
    assert main(["eval", str(run), "--data.path", str(corpus)]) == 0
    assert "high precision (fp32):   loss" in capsys.readouterr().out
    out = tmp_path / "hf_bpe"
    assert main(["export", str(run), "--out", str(out)]) == 0
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok(TEXT)["input_ids"] == bpe.encode(TEXT)
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == 0
    gen = transformers.pipeline("text-generation", str(out))
    assert gen("def ", max_new_tokens=4, do_sample=False)[0]["generated_text"].startswith("def")


def test_export_without_transformers_is_one_line(tiny: dict, tmp_path: Path, monkeypatch,
                                                 capsys) -> None:
    run = _run(tiny)
    capsys.readouterr()
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers fails
    assert main(["export", str(run), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "pip install transformers" in err
    assert not (tmp_path / "x").exists()


def test_importing_transformers_through_snip_is_quiet() -> None:
    """An installed torchao built for another torch prints 'Failed to load ... .so' and torch
    deprecation warnings when transformers' model classes import it; snip's import silences
    exactly those."""
    code = ("from snip.models.hf import _transformers; tf = _transformers(); "
            "tf.AutoTokenizer; tf.pipeline")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert "Failed to load" not in done.stderr and "deprecated" not in done.stderr


# -- continue pretraining an HF checkpoint ------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_train_init_from_hf_continues_the_hf_weights(arch: str, tiny: dict,
                                                     tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from snip.models.hf import hf_dir_state, tiny_hf_model

    hf_dir = tmp_path / f"hf_{arch}"
    tiny_hf_model(arch, seed=3).save_pretrained(hf_dir)
    flags = [f"--{k}={v}" for k, v in tiny.items() if k != "model.name"]
    argv = ["train", "--init-from-hf", str(hf_dir), *flags, "--train.steps=2",
            "--train.eval_every=2", "--train.ckpt_every=2", "--run.name=cont",
            "--precision.preset=fp8_e4m3_tile128"]
    assert main(argv) == 0
    run = tmp_path / "runs" / "cont"
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(e["event"] == "init_from_hf" for e in events)
    start = hf_dir_state(hf_dir)
    after = load_file(str(checkpoint.find(run) / "model.safetensors"))
    lr = from_sources(overrides=tiny).train.lr
    # two AdamW steps move each weight by at most ~lr per step (|m_hat/sqrt(v_hat)| <= ~1,
    # plus decoupled weight decay lr*wd*|w| << lr for |w| < 1): the HF weights were loaded
    moved = max(float((after[k] - start[k]).abs().max()) for k in start)
    assert 0 < moved <= 3 * lr
    fresh = load_file(str(checkpoint.find(_run(tiny, **{"run.name": "fresh"}))
                          / "model.safetensors"))
    # a fresh init is far from the HF weights (0.14 here), ten times the bound above
    assert max(float((fresh[k] - start[k]).abs().max()) for k in start) > 30 * lr
    cfg = json.loads((hf_dir / "config.json").read_text())
    assert f'name = "hf:{hf_dir.resolve()}"' in (run / "config.toml").read_text()
    assert cfg["hidden_size"] == 64
    # --resume rebuilds the hf: shape and continues from the run's own checkpoint
    assert main(["train", "--resume", str(run), "--train.steps=3"]) == 0
    assert checkpoint.find(run).name == "step_000003"


def test_init_from_hf_refuses_what_does_not_convert(tmp_path: Path, capsys) -> None:
    from snip.models.hf import tiny_hf_model

    tiny_hf_model("qwen2").save_pretrained(tmp_path / "qwen")
    assert main(["train", "--init-from-hf", str(tmp_path / "qwen")]) == 2
    assert "model_type 'qwen2' cannot be converted" in capsys.readouterr().err
    assert main(["train", "--init-from-hf", str(tmp_path / "nothing")]) == 2
    assert "not a Hugging Face model directory" in capsys.readouterr().err


def test_init_from_hf_whose_weights_fail_leaves_no_run(tiny: dict, tmp_path: Path,
                                                       capsys) -> None:
    """Weights that do not load or fit fail before the run directory is made (a left-behind
    directory refused the corrected command as 'not empty'); one line, exit 2."""
    import shutil

    from snip.models.hf import tiny_hf_model

    good = tmp_path / "hf"
    tiny_hf_model("llama", seed=3).save_pretrained(good)
    truncated, missing = tmp_path / "truncated", tmp_path / "missing"
    for d in (truncated, missing):
        shutil.copytree(good, d)
    (truncated / "model.safetensors").write_bytes((good / "model.safetensors").read_bytes()[:1000])
    (missing / "model.safetensors").unlink()
    capsys.readouterr()  # (transformers' save bar)
    flags = [f"--{k}={v}" for k, v in tiny.items() if k not in ("model.name", "run.name")]
    cases = [(truncated, [], "is not a readable safetensors file"),
             (missing, [], "has no model.safetensors"),
             (good, ["--model.n_layers=4"], "does not fit the model being trained")]
    for hf_dir, extra, message in cases:
        assert main(["train", "--init-from-hf", str(hf_dir), *flags, "--run.name=x",
                     "--train.steps=1", *extra]) == 2, message
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err, err
        assert not (tmp_path / "runs" / "x").exists()
    assert main(["train", "--init-from-hf", str(good), *flags, "--run.name=x",
                 "--train.steps=1"]) == 0  # the corrected command


def test_hf_weights_attached_after_the_trainer_is_built_still_load(tiny: dict,
                                                                   tmp_path: Path) -> None:
    """The hook loads in ``on_build`` (before the run directory is made); appended to a built
    Trainer's hooks it loads at the start instead, as it did before."""
    from snip.integrations.pretrained import HFWeights, init_from_hf
    from snip.models.hf import hf_dir_state, tiny_hf_model
    from snip.train.loop import Trainer

    hf_dir = tmp_path / "hf"
    tiny_hf_model("llama", seed=3).save_pretrained(hf_dir)
    values, _ = init_from_hf(hf_dir, {k: v for k, v in tiny.items() if k != "model.name"})
    trainer = Trainer(from_sources(overrides={**values, "train.steps": 1}))
    hook = HFWeights(hf_dir)
    trainer.hooks.append(hook)
    try:
        trainer.run()
    finally:
        trainer.close()
    assert hook.loaded
    start, now = hf_dir_state(hf_dir), trainer.model.state_dict()
    lr = from_sources(overrides=tiny).train.lr
    assert max(float((now[k] - start[k]).abs().max()) for k in start) <= 3 * lr  # one step


@pytest.mark.parametrize("override", [{"dist.strategy": "fsdp"},
                                      {"writeback.policy": "stochastic"}])
def test_init_from_hf_refuses_what_it_does_not_support_yet(tmp_path: Path,
                                                           override: dict) -> None:
    from snip.integrations.pretrained import init_from_hf
    from snip.models.hf import tiny_hf_model
    from snip.train.config import WritebackPolicy
    from snip.train.distributed import Strategy

    tiny_hf_model("llama").save_pretrained(tmp_path / "hf")
    (key, text), = override.items()
    typed = Strategy(text) if key == "dist.strategy" else WritebackPolicy(text)
    for value in (text, typed):  # a command-line string or a typed override
        with pytest.raises(UserError, match="--init-from-hf does not support"):
            init_from_hf(tmp_path / "hf", {key: value})
    assert init_from_hf(tmp_path / "hf", {"dist.strategy": "ddp",
                                          "writeback.policy": "none"})[0]["dist.strategy"] == "ddp"


# -- SnipCallback -------------------------------------------------------------------------------


def _hf_setup(seed: int = 0):
    import snip
    from snip.models.hf import tiny_hf_model
    from snip.planner import Controller

    model = tiny_hf_model("llama", seed=seed).train()
    snip.convert(model, "fp8_e4m3_tile128")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(7)
    data = [torch.randint(0, 256, (4, 32), generator=gen) for _ in range(16)]
    controller = Controller(budget=0.5, every=3, warmup=2, seed=0)
    return model, opt, data, controller


def _steps(model, opt, data, cb, state, args, first: int, last: int, save_at: int = -1):
    """What transformers.Trainer does around its callbacks, for steps first..last."""
    for step in range(first, last + 1):
        x = data[step % len(data)]
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        state.global_step = step
        cb.on_step_end(args, state, None, model=model, optimizer=opt)
        if step == save_at:
            folder = Path(args.output_dir) / f"checkpoint-{step}"
            folder.mkdir(parents=True)
            torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, folder / "s.pt")
            cb.on_save(args, state, None)


def test_snip_callback_replans_logs_and_resumes_the_same_plans(tmp_path: Path) -> None:
    from snip.integrations.hf import PLAN_FILE, STATE_FILE, SnipCallback

    args = SimpleNamespace(output_dir=str(tmp_path / "out"))
    model, opt, data, controller = _hf_setup()
    batch = {"input_ids": data[0][:2], "labels": data[0][:2]}
    cb = SnipCallback(controller, batch_fn=lambda k: batch)
    state = transformers.TrainerState()
    _steps(model, opt, data, cb, state, args, 1, 8, save_at=5)
    assert sorted(cb.plans) == [2, 5, 8]  # warmup 2, then every 3
    assert 0 < cb.fp4_flop_fraction <= 0.5 + 1e-9
    logs: dict = {}
    cb.on_log(args, state, None, logs=logs)
    assert logs["snip_fp4_flop_fraction"] == cb.fp4_flop_fraction and logs["snip_plans"] == 3
    folder = tmp_path / "out" / "checkpoint-5"
    assert (folder / STATE_FILE).is_file() and (folder / PLAN_FILE).is_file()
    # resume from checkpoint-5 in a fresh model/controller: the plan of step 8 is the same
    model2, opt2, data2, controller2 = _hf_setup(seed=1)
    saved = torch.load(folder / "s.pt", weights_only=False)
    model2.load_state_dict(saved["model"])
    opt2.load_state_dict(saved["opt"])
    cb2 = SnipCallback(controller2, batch_fn=lambda k: batch)
    state2 = transformers.TrainerState()
    state2.global_step = 5
    cb2.on_train_begin(args, state2, None, model=model2)
    assert cb2.plan.to_dict() == cb.plans[5].to_dict()  # the plan in force, re-applied
    assert len(controller2.history) == 2 and controller2.ema is not None  # cycles 2 and 5
    _steps(model2, opt2, data2, cb2, state2, args, 6, 8)
    assert sorted(cb2.plans) == [8]
    strip = {"meta"}  # the meta holds timings; the formats per layer must be equal
    assert ({k: v for k, v in cb2.plans[8].to_dict().items() if k not in strip}
            == {k: v for k, v in cb.plans[8].to_dict().items() if k not in strip})


def test_snip_callback_in_a_real_trainer(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")  # transformers.Trainer needs it
    from snip.integrations.hf import SnipCallback

    model, _, data, controller = _hf_setup()
    ds = [{"input_ids": x[0], "labels": x[0]} for x in data]
    batch = {"input_ids": data[0][:2], "labels": data[0][:2]}
    cb = SnipCallback(controller, batch_fn=lambda k: batch)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), max_steps=6,
                                          per_device_train_batch_size=2, save_steps=3,
                                          report_to=[], use_cpu=True, logging_steps=1)
    transformers.Trainer(model=model, args=args, train_dataset=ds, callbacks=[cb]).train()
    assert sorted(cb.plans) == [2, 5]
