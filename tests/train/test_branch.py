"""Branching (--init-from), resume rules, the config history and the schedule's continuity.

Tolerances: every ``approx`` here compares float64 arithmetic on the same numbers summed in
another order (an ILP's objective against brute force's, a fraction of integer FLOPs, a JSON
round trip); Python floats round the same on every CPU, so ``rel=1e-9`` (or approx's default
1e-6) is millions of times wider than the ~n x 2^-53 such a sum can differ by."""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path

import numpy as np
import pytest

from snip.cli import main
from snip.data import load_dataset
from snip.train import from_sources, train
from snip.train.schedule import Schedule, Shape


def _events(run: Path, kind: str) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def _ckpt(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"step_{step:06d}"


def test_branch_with_parent_settings_reproduces_the_parent_bit_for_bit(tiny: dict) -> None:
    parent = train(from_sources(overrides={**tiny, "run.name": "parent"}))
    run = Path(tiny["run.dir"]) / "parent"
    child_cfg = from_sources(overrides={"run.name": "child"}, init_from=_ckpt(run, 6))
    assert child_cfg.run.dir == tiny["run.dir"] and child_cfg.model.name == "tiny"
    child = train(child_cfg, init_from=_ckpt(run, 6))
    assert child.losses == {s: v for s, v in parent.losses.items() if s > 6}  # bit for bit
    # the branch evaluates at its start: the parent's own step-6 evaluation, exactly
    parent_evals = {e.step: e for e in parent.evals}
    assert child.evals[0] == parent_evals[6] and child.evals[-1] == parent_evals[12]
    child_dir = Path(tiny["run.dir"]) / "child"
    branch = _events(child_dir, "branch")
    assert branch[0]["step"] == 6 and branch[0]["inherited_precision"] is True
    assert [e["step"] for e in _events(child_dir, "train")] == list(range(7, 13))


def test_branch_with_new_precision_and_data_order(tiny: dict) -> None:
    parent = train(from_sources(overrides={**tiny, "run.name": "parent"}))
    ckpt = _ckpt(Path(tiny["run.dir"]) / "parent", 6)
    fp4 = train(from_sources(overrides={"run.name": "fp4", "precision.preset": "mxfp4"},
                             init_from=ckpt), init_from=ckpt)
    fp4_dir = Path(tiny["run.dir"]) / "fp4"
    saved = tomllib.loads((fp4_dir / "config.toml").read_text())
    assert saved["precision"]["preset"] == "mxfp4" and saved["precision"]["mode"] == "fixed"
    plan = json.loads((fp4_dir / "plans" / "step_6.json").read_text())
    assert plan["meta"]["fp4_flop_fraction"] == 1.0
    assert fp4.losses.keys() == {s for s in parent.losses if s > 6}
    assert fp4.losses != {s: v for s, v in parent.losses.items() if s > 6}
    # another data order: other batches from the same state
    other = train(from_sources(overrides={"run.name": "order1", "data.order_seed": 1},
                               init_from=ckpt), init_from=ckpt)
    assert other.losses[7] != parent.losses[7]
    assert _eval_pair(other, 6) == _eval_pair(parent, 6)  # same state, same windows


def _eval_pair(result, step: int) -> tuple[float, float]:
    e = next(e for e in result.evals if e.step == step)
    return e.loss, e.loss_hp


def test_branch_errors(tiny: dict, capsys: pytest.CaptureFixture) -> None:
    train(from_sources(overrides={**tiny, "run.name": "parent"}))
    run = Path(tiny["run.dir"]) / "parent"
    # onto the parent's own run directory
    assert main(["train", "--init-from", str(_ckpt(run, 6)), "--run.name", "parent"]) == 2
    assert "already holds checkpoints" in capsys.readouterr().err
    # a new run (branch or fresh) inside the run or its checkpoints: refused, nothing made
    for new in (["--init-from", str(_ckpt(run, 6)), "--run.dir", str(run)],
                ["--run.dir", str(run / "checkpoints"), "--run.name", "step_000099"]):
        before = sorted(run.rglob("*"))
        assert main(["train", *new]) == 2
        assert f"lies inside the run {run.resolve()}" in capsys.readouterr().err
        assert sorted(run.rglob("*")) == before
    # a model of another shape
    assert main(["train", "--init-from", str(_ckpt(run, 6)), "--run.name", "b",
                 "--model.name", "small"]) == 2
    assert "different model shape" in capsys.readouterr().err
    # not a checkpoint; both flags
    assert main(["train", "--init-from", str(run / "plans"), "--run.name", "c"]) == 2
    assert "--init-from" in capsys.readouterr().err
    assert main(["train", "--init-from", str(run), "--resume", str(run)]) == 2
    assert "not both" in capsys.readouterr().err


def test_resume_refuses_precision_changes_and_touches_nothing(tiny: dict, ctrl_c_after,
                                                              capsys: pytest.CaptureFixture
                                                              ) -> None:
    with ctrl_c_after(5):
        train(from_sources(overrides={**tiny, "run.name": "cut"}))
    run = Path(tiny["run.dir"]) / "cut"
    before = {f: (run / f).read_bytes() for f in ("config.toml", "metrics.jsonl")}
    assert main(["train", "--resume", str(run), "--precision.preset", "mxfp4"]) == 2
    err = capsys.readouterr().err
    assert "--resume cannot change precision" in err and "--init-from" in err
    assert {f: (run / f).read_bytes() for f in before} == before


def test_resume_with_more_steps_keeps_lr_continuous_and_records_history(tiny: dict,
                                                                        ctrl_c_after) -> None:
    full = train(from_sources(overrides={**tiny, "run.name": "full"}))
    with ctrl_c_after(8):
        train(from_sources(overrides={**tiny, "run.name": "cut"}))
    run = Path(tiny["run.dir"]) / "cut"
    longer = train(from_sources(resume=run, overrides={"train.steps": 20}), resume=run)
    assert longer.step == 20
    lrs = {e["step"]: e["lr"] for e in _events(run, "train")}
    full_lrs = {e["step"]: e["lr"] for e in _events(Path(full.run_dir), "train")}
    assert lrs[9] == full_lrs[9]  # the first resumed step keeps the original learning rate
    steps = sorted(lrs)
    assert all(lrs[a] >= lrs[b] for a, b in zip(steps[8:], steps[9:], strict=False))
    assert math.isclose(lrs[20], tiny.get("train.lr", 3e-3) * 0.1, rel_tol=0.05)
    saved = tomllib.loads((run / "config.toml").read_text())
    assert saved["train"]["steps"] == 20
    assert saved["history"] == [{"step": 8, "train.steps": [12, 20]}]
    # resuming again from the newest checkpoint keeps the history
    again = train(from_sources(resume=run, overrides={"train.steps": 22}), resume=run)
    assert again.step == 22
    saved = tomllib.loads((run / "config.toml").read_text())
    assert [h["step"] for h in saved["history"]] == [8, 20]


@pytest.mark.parametrize("shape", list(Shape))
def test_schedule_shapes_and_continuation(shape: Shape) -> None:
    s = Schedule(lr=1.0, steps=100, warmup_steps=10, min_lr_ratio=0.1, shape=shape)
    assert s(0) == pytest.approx(1 / 11) and s(9) == pytest.approx(10 / 11)
    assert s(10) == pytest.approx(1.0)
    assert s(100) == pytest.approx(1.0 if shape is Shape.CONSTANT else 0.1)
    for at in (5, 40, 90):
        longer = s.continued(at, 300)
        assert longer(at) == pytest.approx(s(at))  # no jump at the continuation point
        assert longer(300) == pytest.approx(1.0 if shape is Shape.CONSTANT else 0.1)
        values = [longer(k) for k in range(max(at, 10), 301)]
        assert all(a >= b - 1e-12 for a, b in zip(values, values[1:], strict=False))


def test_wsd_is_stable_then_decays() -> None:
    s = Schedule(lr=1.0, steps=110, warmup_steps=10, shape=Shape.WSD, min_lr_ratio=0.0)
    assert s(50) == 1.0 and s(90) == pytest.approx(1.0) and s(100) == pytest.approx(0.5)


def test_strided_eval_windows_cover_the_whole_split(corpus: Path) -> None:
    ds = load_dataset(corpus)
    batches = list(ds.strided_batches("val", 4, 32, 3))
    assert len(batches) == 3 and all(x.shape == (4, 32) for x, _ in batches)
    val = np.asarray(ds.val)
    first, last = batches[0][0][0].numpy(), batches[-1][1][-1].numpy()
    assert (first == val[:32]).all() and (last == val[-32:]).all()
    assert list(ds.strided_batches("val", 4, 32, 3))[1][0].equal(batches[1][0])  # fixed
