"""snip eval and snip sample on a checkpoint: numbers that match training, clean errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from snip.cli import main
from snip.train import from_sources, train
from snip.train.inference import load


@pytest.fixture
def run(tiny: dict) -> tuple[Path, object]:
    result = train(from_sources(overrides={**tiny, "precision.preset": "mxfp4"}))
    return Path(tiny["run.dir"]) / "tiny", result


def test_eval_reproduces_the_runs_own_final_evaluation(run, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    path, result = run
    out = tmp_path / "eval.json"
    assert main(["eval", str(path), "--json", str(out)]) == 0
    numbers = json.loads(out.read_text())
    assert numbers["step"] == 12 and numbers["precision"] == "its plan"
    # same checkpoint, same windows, same plan: the training run's last evaluation exactly
    assert numbers["val_loss"] == result.val_loss and numbers["val_loss_hp"] == result.val_loss_hp
    assert "high precision" in capsys.readouterr().out
    # another precision changes the quantized loss only
    assert main(["eval", str(path), "--precision.preset", "bf16", "--json", str(out)]) == 0
    other = json.loads(out.read_text())
    assert other["precision"] == "bf16" and other["val_loss_hp"] == numbers["val_loss_hp"]
    assert other["val_loss"] != numbers["val_loss"]


def test_eval_with_bf16_gemms_keeps_the_runs_plan(run, tmp_path: Path) -> None:
    """``--precision.accum`` changes how the GEMMs multiply, not which plan is evaluated."""
    path, result = run
    out = tmp_path / "eval.json"
    assert main(["eval", str(path), "--precision.accum", "bf16", "--json", str(out)]) == 0
    numbers = json.loads(out.read_text())
    assert numbers["precision"] == "its plan" and numbers["val_loss_hp"] == result.val_loss_hp
    assert numbers["val_loss"] != result.val_loss  # bf16 GEMMs round differently


def test_eval_on_another_corpus_and_bad_input(run, tmp_path: Path,
                                              capsys: pytest.CaptureFixture) -> None:
    path, _ = run
    text = tmp_path / "other.txt"
    text.write_text("completely different text, repeated. " * 400)
    assert main(["eval", str(path), "--data.path", str(text), "--train.eval_batches", "2"]) == 0
    assert "other.txt" in capsys.readouterr().out
    assert main(["eval", str(tmp_path / "missing")]) == 2
    assert "missing" in capsys.readouterr().err
    assert main(["eval", str(path), "--precision.preset", "fp5"]) == 2
    assert "fp5" in capsys.readouterr().err
    # --json never lands in a run (over its metrics.jsonl) or checkpoint
    metrics = (path / "metrics.jsonl").read_bytes()
    for inside in (path / "metrics.jsonl", path / "checkpoints" / "step_000012" / "e.json"):
        assert main(["eval", str(path), "--json", str(inside)]) == 2
        assert "lies inside the" in capsys.readouterr().err
    assert (path / "metrics.jsonl").read_bytes() == metrics
    assert not (path / "checkpoints" / "step_000012" / "e.json").exists()
    # a run's checkpoints directory: the run and its newest checkpoint are named
    assert main(["eval", str(path / "checkpoints")]) == 2
    err = capsys.readouterr().err
    assert f"pass its run directory {path} " in err and "step_000012" in err


def test_sample_is_reproducible_and_greedy_is_deterministic(run,
                                                            capsys: pytest.CaptureFixture) -> None:
    path, _ = run
    loaded = load(path)
    a = loaded.sample("def ", tokens=20, seed=3)
    assert a == loaded.sample("def ", tokens=20, seed=3) and len(a) > 0
    g = loaded.sample("def ", tokens=20, temperature=0)
    assert g == loaded.sample("def ", tokens=20, temperature=0, seed=9)
    assert main(["sample", str(path), "--prompt", "class ", "--tokens", "10"]) == 0
    assert capsys.readouterr().out.startswith("class ")
    assert main(["sample", str(path), "--tokens", "0"]) == 2
