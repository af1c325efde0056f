"""``torch.compile`` of a converted model: it compiles, trains, and changes no bit.

Each ``QLinear``'s quantized call runs outside the compiled graphs (``torch.compiler.disable``:
one graph break per layer call), so compiled and eager runs execute the same kernels on the
same operands.  The layers between them here are ReLUs, which Inductor computes exactly (a
select), so forward outputs and the gradients of the input and of every weight (the outputs of
fprop, dgrad and wgrad) must be equal bit for bit.  Compiling costs seconds per preset on a
loaded 2-core machine: four presets run in the default suite, the other four under ``-m slow``.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

from snip.nn import QLinear

FAST = ["bf16", "fp8_e4m3", "mxfp4", "nvfp4"]
SLOW = ["fp8_e4m3_tile128", "mxfp8_e4m3", "fp4_e2m1_tile128", "fp4_e2m1_tensor"]


class _Net(nn.Module):
    """Two quantized layers with exact ops between them (a ReLU, a scaling by a power of two)."""

    def __init__(self, preset: str) -> None:
        super().__init__()
        self.q1 = QLinear(32, 48, specs=preset, seed=1)
        self.q2 = QLinear(48, 32, specs=preset, seed=2, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.q2(torch.relu(self.q1(x * 2.0)) * 0.5)


def _model(preset: str) -> nn.Module:
    torch.manual_seed(0)
    return _Net(preset)


def _step(model: nn.Module, fn, x: torch.Tensor, dy: torch.Tensor):
    x = x.clone().requires_grad_()
    y = fn(x)
    y.backward(dy)
    return y.detach(), x.grad, [p.grad.clone() for p in model.parameters()]


def _check(preset: str) -> None:
    torch._dynamo.reset()
    counters.clear()
    g = torch.Generator().manual_seed(3)
    eager = _model(preset)
    compiled = copy.deepcopy(eager)
    fn = torch.compile(compiled)
    for _ in range(2):  # two steps: fresh SR noise, no recompile on the step counter
        x, dy = torch.randn(40, 32, generator=g), torch.randn(40, 32, generator=g)
        ye, dxe, dwe = _step(eager, eager, x, dy)
        yc, dxc, dwc = _step(compiled, fn, x, dy)
        assert torch.equal(ye, yc) and torch.equal(dxe, dxc)
        assert all(torch.equal(a, b) for a, b in zip(dwe, dwc, strict=True))
        for m in (eager, compiled):
            m.zero_grad(set_to_none=True)
    assert [m.step for m in compiled.modules() if isinstance(m, QLinear)] == [2, 2]
    assert counters["stats"]["unique_graphs"] >= 2  # the ops between the layers did compile


@pytest.mark.parametrize("preset", FAST)
def test_compiled_equals_eager(preset):
    _check(preset)


@pytest.mark.slow
@pytest.mark.parametrize("preset", SLOW)
def test_compiled_equals_eager_more_presets(preset):
    _check(preset)


def test_graph_breaks_are_the_quantized_calls_only():
    """Everything but the quantized calls is traced: each break is a ``_quantized`` call."""
    torch._dynamo.reset()
    counters.clear()
    fn = torch.compile(_model("mxfp4"), backend="eager")
    fn(torch.randn(8, 32))
    breaks = counters["graph_break"]
    assert sum(breaks.values()) >= 2 and all("QLinear._quantized" in r for r in breaks)
