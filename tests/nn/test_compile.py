"""``torch.compile`` of a converted model: it compiles, trains, and changes no bit.

Under compile each ``QLinear`` calls the :mod:`snip.nn.ops` custom ops, whose real
implementations are the functions the eager autograd Function runs, so compiled and eager runs
execute the same kernels on the same operands with the same seeds.  The layers between them
here are ReLUs and scalings by powers of two, which Inductor computes exactly, so forward
outputs and the gradients of the input and of every weight (the outputs of fprop, dgrad and
wgrad) must be equal bit for bit.  Compiling costs seconds per preset on a loaded 2-core
machine: four presets run in the default suite, the other four under ``-m slow``.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

from snip.nn import QLinear, SaveMode

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


def _step(model: nn.Module, fn, x: torch.Tensor, dy: torch.Tensor, input_grad: bool = True,
          autocast: bool = False):
    x = x.clone().requires_grad_(input_grad)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y = fn(x)
    y.backward(dy.to(y.dtype))
    return y.detach(), x.grad, [p.grad.clone() for p in model.parameters()]


def _same(eager: nn.Module, compiled: nn.Module, fn, g: torch.Generator, steps: int = 2,
          input_grad: bool = True, autocast: bool = False) -> None:
    """``steps`` training steps of both models on the same batches: equal bit for bit."""
    for _ in range(steps):  # fresh SR noise each step
        x, dy = torch.randn(40, 32, generator=g), torch.randn(40, 32, generator=g)
        ye, dxe, dwe = _step(eager, eager, x, dy, input_grad, autocast)
        yc, dxc, dwc = _step(compiled, fn, x, dy, input_grad, autocast)
        assert ye.dtype == yc.dtype and torch.equal(ye, yc)
        assert (dxe is None and dxc is None) or torch.equal(dxe, dxc)
        assert all(torch.equal(a, b) for a, b in zip(dwe, dwc, strict=True))
        for m in (eager, compiled):
            m.zero_grad(set_to_none=True)


def _steps(model: nn.Module) -> list[int]:
    return [m.step for m in model.modules() if isinstance(m, QLinear)]


def _check(preset: str) -> None:
    torch._dynamo.reset()
    counters.clear()
    g = torch.Generator().manual_seed(3)
    eager = _model(preset)
    compiled = copy.deepcopy(eager)
    fn = torch.compile(compiled)
    _same(eager, compiled, fn, g)
    assert _steps(compiled) == _steps(eager) == [2, 2]
    # one graph, no break at the layers, no recompile when the step counter advances
    assert not counters["graph_break"]
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize("preset", FAST)
def test_compiled_equals_eager(preset):
    _check(preset)


@pytest.mark.slow
@pytest.mark.parametrize("preset", SLOW)
def test_compiled_equals_eager_more_presets(preset):
    _check(preset)


def test_a_new_setting_recompiles_and_stays_exact():
    """A re-plan (``set_specs``) between steps recompiles the graph (the layer's config handle
    is a guarded int) and the compiled model follows it bit for bit; no input gradient needed
    (the first layer of a model) also matches."""
    torch._dynamo.reset()
    counters.clear()
    g = torch.Generator().manual_seed(4)
    eager = _model("mxfp4")
    compiled = copy.deepcopy(eager)
    fn = torch.compile(compiled)
    _same(eager, compiled, fn, g, steps=1, input_grad=False)
    for m in (eager, compiled):
        m.q1.set_specs("nvfp4")
    _same(eager, compiled, fn, g, steps=2, input_grad=False)
    assert counters["stats"]["unique_graphs"] == 2


def test_autocast_compiled_equals_eager():
    """Under bf16 autocast the ops return the autocast dtype, as the eager layer does."""
    torch._dynamo.reset()
    counters.clear()
    g = torch.Generator().manual_seed(6)
    eager = _model("mxfp4")
    compiled = copy.deepcopy(eager)
    _same(eager, compiled, torch.compile(compiled), g, autocast=True)
    assert not counters["graph_break"]


def test_encoded_saves_break_the_graph_and_stay_exact():
    """``save="encoded"`` keeps packed operands, which an op cannot return: those layers run
    the eager Function outside the graph (one break per call), still bit for bit."""
    torch._dynamo.reset()
    counters.clear()
    g = torch.Generator().manual_seed(5)
    eager = _model("mxfp4")
    for m in eager.modules():
        if isinstance(m, QLinear):
            m.save = SaveMode.ENCODED
    compiled = copy.deepcopy(eager)
    fn = torch.compile(compiled)
    _same(eager, compiled, fn, g)
    breaks = counters["graph_break"]
    assert sum(breaks.values()) >= 2 and all("QLinear._quantized" in r for r in breaks)


def test_pickled_layer_has_its_own_handle_and_step():
    """A handle indexes this process's registry: unpickling makes it anew, keeps the step."""
    m = _model("mxfp4").q1
    m.step = 7
    clone = pickle.loads(pickle.dumps(m))
    assert clone.step == 7 and clone._handle == m._handle
    clone.step = 8
    assert m.step == 7  # the counters are not shared
    for entry in m._cfgs.values():  # as if registered in another process's registry
        entry[1] = -1
    assert pickle.loads(pickle.dumps(m))._handle == clone._handle


@pytest.mark.parametrize("preset,bias", [("mxfp4", True), ("nvfp4", False)])
def test_custom_ops_pass_torch_opcheck(preset, bias):
    """``torch.library.opcheck``: schema, fake implementations against the real ones, the
    autograd registration and AOT dispatch with dynamic shapes, for both ops."""
    from snip.nn.ops import quantized_linear_backward_op, quantized_linear_op

    torch.manual_seed(0)
    q = QLinear(32, 48, specs=preset, seed=1, bias=bias)
    x, dy, step = torch.randn(40, 32, requires_grad=True), torch.randn(40, 48), torch.tensor(3)
    torch.library.opcheck(quantized_linear_op,
                          (x, q.weight, q.bias, q._handle, torch.float32, step))
    bias_dtype = torch.float32 if bias else None
    for need_x in (True, False):
        torch.library.opcheck(quantized_linear_backward_op,
                              (dy, x.detach(), q.weight.detach(), q._handle, torch.float32,
                               step, need_x, True, bias_dtype))
