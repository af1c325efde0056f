"""benchmarks/profile_layer_step.py records exactly the quantizer calls a layer step makes."""

import torch
from torch import nn

import snip.nn.gemm as gemm
from _benchmarks import load
from snip.formats import Rounding
from snip.nn import QLinear
from snip.nn.specs import Gemm

script = load("profile_layer_step", "profile_layer_step_script")


def _step(preset: str):
    torch.manual_seed(0)
    x = torch.randn(64, 32, requires_grad=True)
    layer = QLinear.from_linear(nn.Linear(32, 48, bias=False), preset)
    return script.layer_step(layer, x, torch.randn(64, 48))


def test_records_the_calls_the_function_makes_and_restores_the_quantizer() -> None:
    real = gemm.quantize_operand
    assert script.recorded_calls(_step("fp32")) == []  # identity specs quantize nothing
    # bf16: Q(X) is saved for wgrad and Q(dY) shared by both backward GEMMs -> X, W, dY once
    bf16 = script.recorded_calls(_step("bf16"))
    assert [(c.shape, c.axis) for c in bf16] == [((48, 32), -1), ((64, 32), -1), ((64, 48), -1)]
    # MXFP4 quantizes every operand per GEMM along its contraction axis (fprop W, X; dgrad
    # W, dY; wgrad X, dY), dY stochastically
    mx = script.recorded_calls(_step("mxfp4"))
    assert [(c.shape, c.axis, c.rounding) for c in mx] == [
        ((48, 32), -1, Rounding.RNE), ((64, 32), -1, Rounding.RNE),
        ((48, 32), 0, Rounding.RNE), ((64, 48), -1, Rounding.STOCHASTIC),
        ((64, 32), 0, Rounding.RNE), ((64, 48), 0, Rounding.STOCHASTIC)]
    assert gemm.quantize_operand is real


def test_a_recorded_call_replays_the_layers_own_stream() -> None:
    call = script.recorded_calls(_step("mxfp4"))[3]  # dgrad's dY at the layer's first step
    assert call.seed == gemm.operand_seed(0, 0, Gemm.DGRAD, gemm.Operand.GRAD_OUTPUT)
    assert call.describe() == {"shape": [64, 48], "spec": call.spec.name, "axis": -1,
                               "rounding": "stochastic"}
    assert script.layer_shapes("w256") == {"attn": (256, 256), "ffn_up": (256, 704),
                                           "ffn_down": (704, 256)}


def test_the_minimal_function_is_nn_linear_bit_for_bit_and_the_floor_times_every_arm() -> None:
    """The floor's control must do nn.Linear's three GEMMs (same values and grads), so that its
    time is the Python Function's cost alone. Tolerance: the same products, but autograd may
    form the weight gradient in the other layout, and a BLAS kernel for another layout may sum
    the 16 terms in another order: a few fp32 ulps of O(1) values on any CPU (assert_close's
    fp32 defaults, rtol 1.3e-6 and atol 1e-5, allow that and nothing more)."""
    torch.manual_seed(0)
    base = nn.Linear(16, 16, bias=False)
    x = torch.randn(16, 16, requires_grad=True)
    dy = torch.randn(16, 16)
    y = script.MinimalLinearFn.apply(x, base.weight)
    y.backward(dy)
    gx, gw = x.grad.clone(), base.weight.grad.clone()
    x.grad = base.weight.grad = None
    ref = base(x)
    ref.backward(dy)
    for got, want in ((y, ref), (gx, x.grad), (gw, base.weight.grad)):
        torch.testing.assert_close(got, want)
    times = script.floor_arms(["bf16"], rounds=1)
    assert list(times) == ["linear", "minimal_function", "snip_fp32", "bf16"]
    assert all(len(v) == 1 and v[0] > 0 for v in times.values())


def test_the_probes_kernel_arm_does_the_quantizers_work_and_extra_is_paired() -> None:
    """``--probe``: the bare-kernel arm writes what snip's quantizer call returns (same work,
    none of the Python), and the extra per round is arm - GEMMs - the calls alone."""
    small, out = torch.randn(32, 32), torch.full((32, 32), float("nan"))
    calls = script.probe_calls(small, out)
    want = calls["gemms+quantize"]()
    calls["gemms+kernel"]()
    assert torch.equal(out, want)
    times = {"gemms": [100.0, 110.0, 90.0],
             "gemms+quantize": [160.0, 170.0, 150.0], "alone:gemms+quantize": [40.0, 40.0, 40.0],
             "gemms+kernel": [110.0, 120.0, 100.0], "alone:gemms+kernel": [10.0, 10.0, 10.0],
             "gemms+clone": [105.0, 112.0, 96.0], "alone:gemms+clone": [5.0, 5.0, 5.0]}
    extra = script.probe_extra(times)
    assert extra["gemms+quantize"][0] == 20.0 and extra["gemms+kernel"][0] == 0.0
    assert extra["gemms+clone"][1] < extra["gemms+clone"][0] < extra["gemms+clone"][2]


def test_minimal_function_flattens_leading_dimensions_into_rows() -> None:
    """The minimal Function on a 3-D input gives, bit for bit, its 2-D result on the rows."""
    torch.manual_seed(0)
    w = torch.randn(6, 8, requires_grad=True)
    x3 = torch.randn(2, 5, 8, requires_grad=True)
    x2 = x3.detach().reshape(10, 8).requires_grad_()
    dy = torch.randn(10, 6)
    y3 = script.MinimalLinearFn.apply(x3, w)
    y3.backward(dy.reshape(2, 5, 6))
    dw3 = w.grad.clone()
    w.grad = None
    y2 = script.MinimalLinearFn.apply(x2, w)
    y2.backward(dy)
    assert y3.shape == (2, 5, 6) and torch.equal(y3.reshape(10, 6), y2)
    assert x3.grad.shape == x3.shape and torch.equal(x3.grad.reshape(10, 8), x2.grad)
    assert torch.equal(dw3, w.grad)
