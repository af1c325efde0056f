"""`snip.train.evaluation.evaluate`: both losses, and one pass where the forward is plain fp32."""

from __future__ import annotations

import pytest
import torch

from snip.models import build_model, get_config
from snip.nn import convert, disabled
from snip.plan import PrecisionPlan
from snip.train import evaluation
from snip.train.evaluation import evaluate, mean_loss

CPU = torch.device("cpu")


def _model(what: str | PrecisionPlan) -> torch.nn.Module:
    torch.manual_seed(0)
    return convert(build_model(get_config("tiny", n_layers=2, max_seq_len=32)), what)


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    out = []
    for _ in range(2):
        x = torch.randint(0, 256, (3, 32), generator=g)
        out.append((x, torch.roll(x, -1, 1)))
    return out


def _passes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts evaluate's passes over the windows."""
    calls = []

    def counted(*a, **k):
        calls.append(1)
        return mean_loss(*a, **k)

    monkeypatch.setattr(evaluation, "mean_loss", counted)
    return calls


def test_an_fp32_model_is_evaluated_once_and_both_losses_are_the_disabled_pass(monkeypatch):
    model, batches = _model("fp32"), _batches()
    with disabled(model):
        hp = mean_loss(model, batches, CPU)
    calls = _passes(monkeypatch)
    r = evaluate(model, batches, CPU, step=7)
    assert len(calls) == 1
    # the pass it skips would give the same bits: the converted fp32 forward is F.linear's
    assert r.loss == r.loss_hp == hp
    assert r.step == 7


@pytest.mark.parametrize("what", ["mxfp4", "plan", "bf16_autocast"])
def test_a_model_that_quantizes_or_runs_under_autocast_is_evaluated_twice(monkeypatch, what):
    if what == "plan":  # one fprop in FP4, the rest fp32: the forward is not plain
        spec = dict.fromkeys(("fprop", "dgrad", "wgrad"), "fp32")
        what = PrecisionPlan.from_dict({"version": 1, "default": spec, "layers": {
            "layers.0.attention.wq": {**spec, "fprop": "mxfp4"}}})
    model = _model("fp32" if what == "bf16_autocast" else what)
    batches = _batches()
    with disabled(model):
        hp = mean_loss(model, batches, CPU, what == "bf16_autocast")
    calls = _passes(monkeypatch)
    r = evaluate(model, batches, CPU, step=0, bf16=what == "bf16_autocast")
    assert len(calls) == 2
    assert r.loss_hp == hp
    assert r.loss != r.loss_hp


@pytest.mark.parametrize("what, bf16", [("fp32", False), ("mxfp4", False), ("fp32", True)])
def test_done_is_called_once_per_forward_pass_of_a_batch(what, bf16):
    """``snip eval``'s progress bar counts to ``passes * len(batches)``: it ends full."""
    model, batches = _model(what), _batches()
    ticks = []
    evaluate(model, batches, CPU, step=0, bf16=bf16, done=lambda: ticks.append(1))
    assert len(ticks) == evaluation.passes(model, bf16) * len(batches)
    assert evaluation.passes(model, bf16) == (1 if (what, bf16) == ("fp32", False) else 2)
