"""The training loop end to end on a tiny model: files, exact resume, non-finite handling.

Tolerances: every ``approx`` here compares float64 arithmetic on the same numbers summed in
another order (an ILP's objective against brute force's, a fraction of integer FLOPs, a JSON
round trip); Python floats round the same on every CPU, so ``rel=1e-9`` (or approx's default
1e-6) is millions of times wider than the ~n x 2^-53 such a sum can differ by.  The last
step's learning rate (``abs=1e-3``) is one step before the cosine's end, 2.7e-4 above its
floor of 0.1."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from snip.cli import main
from snip.train import checkpoint, from_sources, make_optimizer, train
from snip.train.config import TrainSection
from snip.train.loop import NonFiniteError
from snip.train.resume import schedule_of


def _argv(overrides: dict[str, object]) -> list[str]:
    return [a for k, v in overrides.items() for a in (f"--{k}", str(v))]


def test_tiny_run_end_to_end(tiny: dict, capsys: pytest.CaptureFixture) -> None:
    assert main(["train", *_argv({**tiny, "train.steps": 20, "train.eval_every": 10,
                                  "train.ckpt_every": 5})]) == 0
    run = Path(tiny["run.dir"]) / "tiny"
    assert f"report: {run / 'report.html'}" in capsys.readouterr().out
    for f in ("config.toml", "metrics.jsonl", "plans/step_0.json", "report.html", "loss.png",
              "lr.png", "precision_map.png", "fp4_fraction.png", "throughput.png"):
        assert (run / f).is_file(), f
    # keep_checkpoints = 2 of the 4 saved
    assert [p.name for p in checkpoint.list_checkpoints(run / "checkpoints")] == [
        "step_000015", "step_000020"]
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train_ev = [e for e in events if e["event"] == "train"]
    evals = [e for e in events if e["event"] == "eval"]
    assert [e["step"] for e in train_ev] == list(range(1, 21))
    assert [e["step"] for e in evals] == [0, 10, 20]
    assert evals[-1]["val_loss"] < evals[0]["val_loss"]  # it learns
    assert math.isclose(evals[-1]["ppl"], math.exp(evals[-1]["val_loss"]), rel_tol=1e-6)
    assert all(e["tokens_per_s"] > 0 and "fp4_flop_fraction" in e for e in train_ev)
    plan = json.loads((run / "plans" / "step_0.json").read_text())
    assert plan["version"] == 1 and "layers.0.attention.wq" in plan["layers"]


def test_ctrl_c_saves_and_resume_is_bit_exact(tiny: dict, ctrl_c_after) -> None:
    full = train(from_sources(overrides={**tiny, "run.name": "full"}))
    assert full.step == 12 and not full.interrupted

    with ctrl_c_after(5):
        cut = train(from_sources(overrides={**tiny, "run.name": "cut"}))
    assert cut.interrupted and cut.step == 5

    run_dir = Path(tiny["run.dir"]) / "cut"
    resumed = train(from_sources(resume=run_dir), resume=run_dir)
    assert resumed.step == 12
    after = {s: v for s, v in full.losses.items() if s > 5}
    assert resumed.losses == after  # bit for bit
    assert {**cut.losses, **resumed.losses} == full.losses
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()
             if json.loads(x)["event"] == "train"]
    assert steps == list(range(1, 13))  # one clean history


def _nan_on_call(monkeypatch: pytest.MonkeyPatch, bad_call: int) -> None:
    real = torch.nn.utils.clip_grad_norm_
    calls = []

    def clip(params, max_norm, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        calls.append(1)
        norm = real(params, max_norm, *a, **k)
        return torch.tensor(math.nan) if len(calls) == bad_call else norm

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)


def test_nonfinite_stops_after_saving_last_good_state(tiny: dict,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _nan_on_call(monkeypatch, bad_call=4)
    with pytest.raises(NonFiniteError, match="non-finite .* at step 4.*step 3"):
        train(from_sources(overrides=tiny))
    ckpts = checkpoint.list_checkpoints(Path(tiny["run.dir"]) / "tiny" / "checkpoints")
    assert ckpts[-1].name == "step_000003"
    assert checkpoint.load(ckpts[-1]).step == 3


def test_skip_nonfinite_counts_and_continues(tiny: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    _nan_on_call(monkeypatch, bad_call=4)
    result = train(from_sources(overrides={**tiny, "train.skip_nonfinite": "true"}))
    assert result.step == 12 and result.skipped_steps == 1


def test_lr_schedule_and_decay_groups() -> None:
    t = TrainSection(steps=100, warmup_steps=10, lr=1.0, min_lr_ratio=0.1)
    lrs = [schedule_of(t)(s) for s in range(100)]
    assert lrs[0] < lrs[9] <= 1.0 and max(lrs) == lrs[10] == 1.0
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:], strict=False))
    assert lrs[-1] == pytest.approx(0.1, abs=1e-3)
    from snip.models import build_model

    model = build_model("tiny")
    decay, no_decay = make_optimizer(model, t).param_groups
    ids = {id(p) for p in no_decay["params"]}
    assert id(model.tok_embeddings.weight) in ids and id(model.norm.weight) in ids
    assert no_decay["weight_decay"] == 0
    assert {id(p) for p in decay["params"]} == {
        id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}


def test_precision_accum_bf16_trains_with_bf16_gemms_and_resumes_bit_exact(
        tiny: dict, ctrl_c_after, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--precision.accum bf16`` converts every layer with bf16 GEMMs (so the losses differ
    from the fp32 GEMMs'), and a resume converts with it again: the resumed steps equal the
    uninterrupted run's bit for bit."""
    import snip.nn.gemm as gemm

    accums = set()
    real = gemm.matmul

    def spy(a, b, accum, bias=None):
        accums.add(accum)
        return real(a, b, accum, bias)

    monkeypatch.setattr(gemm, "matmul", spy)
    bf16 = {**tiny, "precision.mode": "fixed", "precision.preset": "mxfp4",
            "precision.accum": "bf16"}
    full = train(from_sources(overrides={**bf16, "run.name": "full"}))
    assert accums == {gemm.Accum.BF16}
    fp32 = train(from_sources(overrides={**bf16, "precision.accum": "fp32", "run.name": "fp32"}))
    assert fp32.losses[12] != full.losses[12]
    with ctrl_c_after(5):
        cut = train(from_sources(overrides={**bf16, "run.name": "cut"}))
    run_dir = Path(tiny["run.dir"]) / "cut"
    resumed = train(from_sources(resume=run_dir), resume=run_dir)
    assert {**cut.losses, **resumed.losses} == full.losses


def test_precision_accum_bad_value_is_a_one_line_error(tiny: dict, capsys) -> None:
    assert main(["train", *_argv({**tiny, "precision.accum": "fp16"})]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "precision.accum" in err[0] and "auto" in err[0]


@pytest.mark.parametrize("accum", [1, 2])
def test_forward_tokens_are_placed_only_when_part_of_the_batch(tiny: dict, accum: int,
                                                               monkeypatch) -> None:
    """A micro-batch's tokens are placed in the step's batch (SR coins of the whole batch);
    a forward over the whole batch is left unplaced, which draws the same coins and keeps each
    layer's settings, and so its config handle and planned quantizer calls, from step to step."""
    import snip.train.loop as loop
    from snip.formats import RowShard

    seen = []
    real = loop.sync_quant_counters
    monkeypatch.setattr(loop, "sync_quant_counters",
                        lambda model, step, tokens=None: seen.append(tokens)
                        or real(model, step, tokens))
    train(from_sources(overrides={**tiny, "train.steps": 2, "train.grad_accum": accum,
                                  "precision.mode": "fixed", "precision.preset": "mxfp4"}))
    tokens = 4 * 32  # batch_size x seq_len
    placed = [None] if accum == 1 else [RowShard(0, tokens), RowShard(tokens // 2, tokens)]
    assert seen == (placed + [None]) * 2  # each step's forwards, then unplaced after it
