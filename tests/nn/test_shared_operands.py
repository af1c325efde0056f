"""Operands quantized once for two GEMMs (issue 21): the shortcut changes no bit.

``Q(X)`` of fprop is wgrad's ``Q(X)`` and ``Q(dY)`` of dgrad is wgrad's ``Q(dY)`` when the spec
is the same and its scale does not depend on the axis (bf16, one tensor scale) with round to
nearest even; the layer then quantizes each once.  Where dgrad's and wgrad's specs are 1-D
blocks, the two ``Q(dY)`` come from one call that reads ``dY`` once.  The gradients must equal
the three GEMMs written out with six separate ``quantize`` calls, and the fast path must equal
the PyTorch reference path (``SNIP_FAST=0``) on every preset the experiments use.
"""

from __future__ import annotations

import pytest
import torch

from snip.formats import fast, get_spec, quantize
from snip.nn import GemmConfig, GemmSpecs, quantized_linear
from snip.nn.gemm import Operand, grad_reusable, input_reusable, operand_seed
from snip.nn.specs import Gemm

T, K, N = 48, 64, 32
MAIN = ["bf16", "fp8_e4m3", "fp8_e4m3_tile128", "mxfp8_e4m3", "mxfp4", "nvfp4",
        "fp4_e2m1_tile128", "fp4_e2m1_tensor"]


def _data():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(T, K, generator=g), torch.randn(N, K, generator=g) / 8,
            torch.randn(N, generator=g), torch.randn(T, N, generator=g))


def _step(specs: GemmSpecs):
    x, w, b, dy = _data()
    x, w, b = (t.clone().requires_grad_() for t in (x, w, b))
    y = quantized_linear(x, w, b, GemmConfig(specs=specs, seed=5, step=2))
    y.backward(dy)
    return y.detach(), x.grad, w.grad, b.grad


def test_reuse_rules():
    for name in ("bf16", "fp8_e4m3", "fp4_e2m1_tensor"):
        assert input_reusable(get_spec(name), get_spec(name))  # RNE X, axis-free scale
    assert grad_reusable(get_spec("bf16"), get_spec("bf16"))
    assert grad_reusable(get_spec("fp8_e4m3"), get_spec("fp8_e4m3"))
    assert not grad_reusable(get_spec("fp4_e2m1_tensor"), get_spec("fp4_e2m1_tensor"))  # SR
    for name in ("mxfp4", "nvfp4", "fp8_e4m3_row", "fp8_e4m3_tile128", "fp32"):
        assert not input_reusable(get_spec(name), get_spec(name))  # axis-bound, or identity
    assert not input_reusable(get_spec("fp8_e4m3"), get_spec("bf16"))


@pytest.mark.parametrize("preset", ["bf16", "fp8_e4m3", "fp4_e2m1_tensor"])
def test_shared_operands_equal_separate_quantizations(preset):
    """dX = Q(dY) Q(W) and dW = Q(dY)^T Q(X), each operand quantized along its own axis."""
    x, w, b, dy = _data()
    s = get_spec(preset)
    y, dx, dw, db = _step(GemmSpecs.uniform(s))
    xq_f = quantize(x, s, axis=-1)
    xq_w = quantize(x, s, axis=0)
    assert torch.equal(xq_f, xq_w)  # what makes the reuse exact
    wq = quantize(w, s.for_weight(), axis=-1)
    assert torch.equal(y, torch.addmm(b, xq_f, wq.t()))
    if grad_reusable(s, s):  # (SR dY, fp4_e2m1_tensor: two draws, quantized twice)
        dyq = quantize(dy, s, axis=-1, rounding=s.grad_rounding)
        assert torch.equal(dyq, quantize(dy, s, axis=0, rounding=s.grad_rounding))
        assert torch.equal(dx, dyq @ quantize(w, s.for_weight(), axis=0))
        assert torch.equal(dw, dyq.t() @ xq_w)


@pytest.mark.parametrize("preset", MAIN)
def test_fast_step_equals_reference_path(preset, monkeypatch):
    """Forward and the three gradients are bit-identical with the fused kernels and without."""
    specs = GemmSpecs.uniform(preset)
    fast_out = _step(specs)
    monkeypatch.setattr(fast, "enabled", lambda: False)
    ref_out = _step(specs)
    for a, r in zip(fast_out, ref_out, strict=True):
        assert torch.equal(a, r)


@pytest.mark.parametrize("dgrad, wgrad", [("mxfp4", "mxfp4"), ("fp4_e2m1_tile128",) * 2,
                                          ("mxfp8_e4m3", "fp8_e4m3_tile128")])
def test_grad_output_quantized_for_both_gemms_in_one_call(dgrad, wgrad, monkeypatch):
    """Backward quantizes ``dY`` for dgrad and wgrad in one call (``fast.quantize_pair``) where
    both specs are 1-D blocks with a one-level scale, and the gradients equal ``dY`` quantized
    separately along each GEMM's axis with its own seed (SR for the FP4 presets), and the
    reference path's."""
    g = torch.Generator().manual_seed(1)
    x, w, dy = torch.randn(48, 64, generator=g), torch.randn(128, 64, generator=g) / 8, \
        torch.randn(48, 128, generator=g)  # 48 tokens: a partial column block
    specs = GemmSpecs(fprop="mxfp4", dgrad=dgrad, wgrad=wgrad)
    cfg = GemmConfig(specs=specs, seed=5, step=2)
    calls = []
    real = fast.quantize_pair
    monkeypatch.setattr(fast, "quantize_pair", lambda *a, **k: calls.append(r := real(*a, **k))
                        or r)

    def step():
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        quantized_linear(xg, wg, None, cfg).backward(dy)
        return xg.grad, wg.grad

    dx, dw = step()
    assert len(calls) == 1 and calls[0] is not None
    d, s = specs.dgrad, specs.wgrad
    dyq_d = quantize(dy, d, axis=-1, rounding=d.grad_rounding,
                     generator=operand_seed(5, 2, Gemm.DGRAD, Operand.GRAD_OUTPUT))
    dyq_w = quantize(dy, s, axis=0, rounding=s.grad_rounding,
                     generator=operand_seed(5, 2, Gemm.WGRAD, Operand.GRAD_OUTPUT))
    assert torch.equal(dx, dyq_d @ quantize(w, d.for_weight(), axis=0))
    assert torch.equal(dw, dyq_w.t() @ quantize(x, s, axis=0))
    monkeypatch.setattr(fast, "enabled", lambda: False)
    ref = step()
    assert len(calls) == 2 and calls[1] is None  # the reference path: two quantize calls
    assert torch.equal(dx, ref[0]) and torch.equal(dw, ref[1])
