"""Adaptive precision: a controller's new plan is applied, saved and logged."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import snip.train.loop as loop
from snip.errors import UserError
from snip.plan import PrecisionPlan
from snip.train import PrecisionController, from_sources, train
from snip.train.metrics import Progress


class SwitchAtStep6:
    """A stand-in controller: FP4 everywhere from step 6 on."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.step_seconds: float | None = None

    def due(self, step: int) -> bool:
        return step == 6

    def on_step_end(self, step, model, optimizer, batch_fn):  # noqa: ANN001, ANN201
        self.calls.append(step)
        x, y = batch_fn(0)
        assert x.shape == y.shape
        return PrecisionPlan.uniform("mxfp4") if step == 6 else None

    def state_dict(self) -> dict:
        return {"calls": list(self.calls)}

    def load_state_dict(self, state: dict) -> None:
        self.calls = list(state["calls"])


def test_controller_plans_are_applied_and_recorded(tiny: dict,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    controller = SwitchAtStep6()
    assert isinstance(controller, PrecisionController)
    monkeypatch.setattr(loop, "make_controller", lambda *a, **k: controller)
    busy: list[tuple[str, list[int]]] = []  # what the bar named, and the controller's calls then
    real_busy = Progress.busy

    @contextlib.contextmanager
    def recorded(self: Progress, what: str) -> Iterator[None]:
        with real_busy(self, what):
            yield
        busy.append((what, list(controller.calls)))

    monkeypatch.setattr(Progress, "busy", recorded)
    result = train(from_sources(overrides={**tiny, "precision.mode": "adaptive"}))
    # asked after every step but the last (a plan made then would never run)
    assert result.step == 12 and controller.calls == list(range(1, 12))
    # the bar names the pauses: validation at steps 6 and 12, the one due statistics cycle
    assert busy == [("validating", list(range(1, 6))),
                    ("re-planning (sensitivity statistics)", list(range(1, 7))),
                    ("validating", list(range(1, 12)))]
    assert controller.step_seconds is not None and controller.step_seconds > 0  # the trainer's
    run = Path(tiny["run.dir"]) / "tiny"
    plan6 = json.loads((run / "plans" / "step_6.json").read_text())
    assert plan6["meta"]["fp4_flop_fraction"] == 1.0
    events = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    plan_events = [e for e in events if e["event"] == "plan"]
    assert [e["step"] for e in plan_events] == [0, 6] and plan_events[1]["changes"] > 0
    fracs = {e["step"]: e["fp4_flop_fraction"] for e in events if e["event"] == "train"}
    assert fracs[6] == 0.0 and fracs[7] == 1.0


def test_adaptive_run_that_never_replans_warns(tiny: dict, capsys: pytest.CaptureFixture) -> None:
    train(from_sources(overrides={**tiny, "train.steps": 3, "precision.mode": "adaptive",
                                  "precision.every": 100}))
    assert "no re-plan falls within steps 0..2" in capsys.readouterr().err
    train(from_sources(overrides={**tiny, "run.name": "b", "train.steps": 3,
                                  "precision.mode": "adaptive", "precision.every": 2,
                                  "precision.warmup": 1}))
    assert "no re-plan" not in capsys.readouterr().err


def test_train_notes_bf16_gemms_where_native_and_unused(tiny: dict, capsys: pytest.CaptureFixture,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    note = "--precision.accum auto runs the quantized GEMMs on bf16 operands"
    monkeypatch.setattr(loop, "_bf16_noted", False)  # (an earlier test may have printed it)
    monkeypatch.setenv("SNIP_BF16_GEMM", "0")
    train(from_sources(overrides={**tiny, "run.name": "a", "train.steps": 1,
                                  "precision.preset": "mxfp4"}))
    assert note not in capsys.readouterr().out
    monkeypatch.setenv("SNIP_BF16_GEMM", "1")
    train(from_sources(overrides={**tiny, "run.name": "b", "train.steps": 1,
                                  "precision.preset": "fp32"}))  # nothing quantized
    assert note not in capsys.readouterr().out
    train(from_sources(overrides={**tiny, "run.name": "c", "train.steps": 1,
                                  "precision.preset": "mxfp4"}))
    assert note in capsys.readouterr().out
    train(from_sources(overrides={**tiny, "run.name": "d", "train.steps": 1,
                                  "precision.preset": "mxfp4"}))
    assert note not in capsys.readouterr().out  # once a process
    monkeypatch.setattr(loop, "_bf16_noted", False)
    with pytest.raises(UserError, match="already holds checkpoints"):  # a start that fails
        train(from_sources(overrides={**tiny, "run.name": "d", "train.steps": 1,
                                      "precision.preset": "mxfp4"}))
    assert note not in capsys.readouterr().out  # says only why
    train(from_sources(overrides={**tiny, "run.name": "c", "train.steps": 2,
                                  "precision.preset": "mxfp4"}),
          resume=Path(str(tiny["run.dir"])) / "c")
    assert note not in capsys.readouterr().out  # --resume cannot change precision.accum


def test_compare_and_audit_trainers_keep_the_train_note_to_themselves(
        tiny: dict, tmp_path, capsys: pytest.CaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The note names ``--precision.accum``, a flag of ``snip train`` only: the trainers that
    ``snip compare`` and ``snip audit`` build (``bf16_note=False``) do not print it, also where
    they train a quantized run's settings (``snip audit --run``)."""
    from snip.cli import main

    note = "--precision.accum auto runs the quantized GEMMs on bf16 operands"
    monkeypatch.setenv("SNIP_BF16_GEMM", "1")
    train(from_sources(overrides={**tiny, "run.name": "mx", "train.steps": 2,
                                  "precision.preset": "mxfp4"}))
    capsys.readouterr()
    monkeypatch.setattr(loop, "_bf16_noted", False)
    trainer = loop.Trainer(from_sources(overrides={**tiny, "run.name": "q", "train.steps": 1,
                                                   "precision.preset": "mxfp4"}),
                           bf16_note=False)
    trainer.close()
    run = Path(tiny["run.dir"]) / "mx"
    assert main(["audit", "--run", str(run), "--train.steps", "2", "--formats", "e4m3",
                 "--train.threads", "1", "--out", str(tmp_path / "audit")]) == 0
    assert main(["compare", "--base", str(run), "--arm", "mxfp4", "--steps", "1",
                 "--train.eval_batches", "1", "--train.threads", "1",
                 "--out", str(tmp_path / "cmp")]) == 0
    assert note not in capsys.readouterr().out
    assert not loop._bf16_noted  # (so it was not printed by the way)
