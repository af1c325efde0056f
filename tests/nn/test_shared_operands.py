"""Operands quantized once for two GEMMs (issue 21): the shortcut changes no bit.

``Q(X)`` of fprop is wgrad's ``Q(X)`` and ``Q(dY)`` of dgrad is wgrad's ``Q(dY)`` when the spec
is the same and its scale does not depend on the axis (bf16, one tensor scale) with round to
nearest even; the layer then quantizes each once.  Layers that share an input (q, k, v)
quantize it once per pass.  The gradients must equal the three GEMMs written out with six
separate ``quantize`` calls, and the fast path must equal the PyTorch reference path
(``SNIP_FAST=0``) on every preset the experiments use.
"""

from __future__ import annotations

import pytest
import torch

from snip.formats import Rounding, RowShard, fast, get_spec, quantize, replace_spec
from snip.nn import GemmConfig, GemmSpecs, quantized_linear
from snip.nn.gemm import grad_reusable, input_reusable

T, K, N = 48, 64, 32
MAIN = ["bf16", "fp8_e4m3", "fp8_e4m3_tile128", "mxfp8_e4m3", "mxfp4", "nvfp4",
        "fp4_e2m1_tile128", "fp4_e2m1_tensor"]


def _data():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(T, K, generator=g), torch.randn(N, K, generator=g) / 8,
            torch.randn(N, generator=g), torch.randn(T, N, generator=g))


def _step(specs: GemmSpecs, cfg: GemmConfig | None = None):
    x, w, b, dy = _data()
    x, w, b = (t.clone().requires_grad_() for t in (x, w, b))
    y = quantized_linear(x, w, b, cfg or GemmConfig(specs=specs, seed=5, step=2))
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
    """Forward and the three gradients are bit-identical with the fused kernels and without;
    one config serves both runs, so the operand calls kept on it follow the switch (no fused
    kernel call runs without the fast path)."""
    specs = GemmSpecs.uniform(preset)
    cfg = GemmConfig(specs=specs, seed=5, step=2)
    fast_out = _step(specs, cfg)
    fused = []
    real = fast._FusedCall.__call__
    monkeypatch.setattr(fast._FusedCall, "__call__", lambda *a: fused.append(1) or real(*a))
    monkeypatch.setattr(fast, "enabled", lambda: False)
    ref_out = _step(specs, cfg)
    assert fused == []
    for a, r in zip(fast_out, ref_out, strict=True):
        assert torch.equal(a, r)


@pytest.mark.skipif("not fast.enabled()", reason="fast path off (numba not installed)")
def test_nvfp4_amax_of_x_and_dy_kept_for_wgrad(monkeypatch):
    """NVFP4's tensor amax of ``X`` (fprop's rows) and ``dY`` (dgrad's rows) is kept on them
    for wgrad's column calls, which compute neither it nor its scale again; a weight is never
    marked (the bits are :func:`test_fast_step_equals_reference_path`'s)."""
    calls = []
    for name in ("_clean_amax", "_clean_amax_1t", "_nvfp4_tensor_scale"):  # (amax pass, scale)
        real = getattr(fast, name)
        monkeypatch.setattr(fast, name, lambda *a, real=real: calls.append(a) or real(*a))
    x, w, b, dy = _data()
    x, w, b = (t.clone().requires_grad_() for t in (x, w, b))
    y = quantized_linear(x, w, b, GemmConfig(specs=GemmSpecs.uniform("nvfp4"), seed=5, step=2))
    y.backward(dy)
    assert calls == []
    assert hasattr(x, fast._AMAX_ATTR) and not hasattr(w, fast._AMAX_ATTR)


def _shared_input_block(presets, x, ws, dys, seeds=(1, 2, 3), tokens=None):
    """Layers reading one input one after the other (q, k, v), then their backward in reverse:
    each layer's output, and its gradients of the input and of its weight."""
    xg = x.clone().requires_grad_()
    wg = [w.clone().requires_grad_() for w in ws]
    ys = [quantized_linear(xg, w, None, GemmConfig(specs=GemmSpecs.uniform(p), seed=s, step=4,
                                                   tokens=tokens))
          for p, w, s in zip(presets, wg, seeds, strict=True)]
    grads = [torch.autograd.grad(ys[i], [xg, wg[i]], dys[i]) for i in reversed(range(len(ys)))]
    return [(y.detach(), *g) for y, g in zip(ys, grads[::-1], strict=True)]


class _NoMemo:
    """A memo that never holds an entry (``snip.nn.gemm._LastInput``'s interface)."""

    entry = property(lambda self: None, lambda self, value: None)


def _count_input_calls(monkeypatch, shape):
    """Spy on quantize_operand: how many calls quantize an operand of ``shape`` per axis."""
    import snip.nn.gemm as gemm
    calls = {-1: 0, 0: 0}
    real = gemm.quantize_operand

    def spy(x, spec, axis, *a, **k):
        if tuple(x.shape) == shape:
            calls[axis] += 1
        return real(x, spec, axis, *a, **k)
    monkeypatch.setattr(gemm, "quantize_operand", spy)
    return calls


@pytest.mark.parametrize("tokens", [None, RowShard(96, 288)], ids=["unplaced", "shard"])
@pytest.mark.parametrize("preset", ["mxfp4", "nvfp4", "fp4_e2m1_tile128", "bf16"])
def test_layers_sharing_an_input_quantize_it_once(preset, tokens, monkeypatch):
    """q, k and v read one ``X``: fprop quantizes it once for the three (RNE: the same bits
    whatever the layer's seed, and wherever the tokens sit in a larger batch), wgrad once more
    for the three, and every output and gradient equals the layers run one by one with nothing
    shared."""
    import snip.nn.gemm as gemm
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 48, 160, generator=g)
    ws = [torch.randn(n, 160, generator=g) / 8 for n in (128, 64, 64)]  # GQA: k, v narrower
    dys = [torch.randn(2, 48, n, generator=g) for n in (128, 64, 64)]
    calls = _count_input_calls(monkeypatch, (96, 160))
    got = _shared_input_block([preset] * 3, x, ws, dys, tokens=tokens)
    reuse_x = input_reusable(get_spec(preset), get_spec(preset))  # (bf16: fprop's Q(X) saved)
    assert calls == {-1: 1, 0: 0 if reuse_x else 1}
    for memo in ("_FPROP_X", "_WGRAD_X"):  # layers one by one, nothing shared
        monkeypatch.setattr(gemm, memo, _NoMemo())
    calls.update({-1: 0, 0: 0})
    want = [_shared_input_block([preset], x, [w], [dy], seeds=(i + 1,), tokens=tokens)[0]
            for i, (w, dy) in enumerate(zip(ws, dys, strict=True))]
    assert calls == {-1: 3, 0: 0 if reuse_x else 3}
    for layer_got, layer_want in zip(got, want, strict=True):  # (y, dX, dW) of each layer
        for a, b in zip(layer_got, layer_want, strict=True):
            assert torch.equal(a, b)


@pytest.mark.skipif("not fast.enabled()", reason="fast path off (numba not installed)")
def test_layers_sharing_an_input_share_one_kernel_call(monkeypatch):
    """With the one-pass kernels (no spy on ``quantize_operand``), q, k and v quantize their
    shared ``X`` with one kernel call per pass too: the memo matches the kernel call itself."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(96, 160, generator=g)
    ws = [torch.randn(n, 160, generator=g) / 8 for n in (128, 64, 64)]
    dys = [torch.randn(96, n, generator=g) for n in (128, 64, 64)]
    seen = []
    real = fast._FusedCall.__call__
    monkeypatch.setattr(fast._FusedCall, "__call__",
                        lambda self, t, *a: seen.append(tuple(t.shape)) or real(self, t, *a))
    _shared_input_block(["mxfp4"] * 3, x, ws, dys)
    assert seen.count((96, 160)) == 2  # fprop's rows once, wgrad's columns once
    assert len(seen) == 2 + 3 * 4  # and each layer's W twice and dY twice


def test_input_memo_follows_writes_specs_and_roundings(monkeypatch):
    """No reuse across an in-place write to ``X`` (its version changes), another spec (an
    adaptive plan's neighbours), or stochastic rounding of ``X`` (a draw per layer)."""
    g = torch.Generator().manual_seed(8)
    x, w = torch.randn(48, 128, generator=g), torch.randn(64, 128, generator=g) / 8
    calls = _count_input_calls(monkeypatch, (48, 128))
    cfg = GemmConfig(specs=GemmSpecs.uniform("mxfp4"))
    y0 = quantized_linear(x, w, None, cfg)
    x.mul_(2)
    y1 = quantized_linear(x, w, None, cfg)
    assert calls[-1] == 2 and torch.equal(y1, 2 * y0)  # (power-of-two scales: exact)
    quantized_linear(x, w, None, GemmConfig(specs=GemmSpecs.uniform("mxfp8_e4m3")))
    assert calls[-1] == 3
    sr = replace_spec("mxfp4", name="mxfp4_sr_x", rounding=Rounding.STOCHASTIC)
    for s in (1, 2):
        quantized_linear(x, w, None, GemmConfig(specs=GemmSpecs.uniform(sr), seed=s))
    assert calls[-1] == 5


def test_input_memo_skips_inference_tensors(monkeypatch):
    """Under ``torch.inference_mode`` tensors have no version counter (an in-place write there
    could not be seen), so layers sharing such an input each quantize it."""
    g = torch.Generator().manual_seed(9)
    w = torch.randn(64, 128, generator=g) / 8
    calls = _count_input_calls(monkeypatch, (48, 128))
    cfg = GemmConfig(specs=GemmSpecs.uniform("mxfp4"))
    with torch.inference_mode():
        x = torch.randn(48, 128, generator=g)
        y0 = quantized_linear(x, w, None, cfg)
        x.mul_(2)
        y1 = quantized_linear(x, w, None, cfg)
    assert calls[-1] == 2 and torch.equal(y1, 2 * y0)
