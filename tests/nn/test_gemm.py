"""The GEMM autograd Function: identity, per-GEMM isolation, SQNR floors, seeds, save modes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from snip.formats import PRESETS, Rounding, RowShard, fast, get_spec, quantize
from snip.nn import GemmConfig, GemmSpecs, SavedBytes, SaveMode, quantized_linear, weight_reusable
from snip.nn.gemm import matmul
from snip.nn.native import sqnr_db
from snip.nn.specs import Accum

T, K, N = 64, 256, 128  # tokens, in_features, out_features


def _data(seed: int = 0, shape: tuple[int, ...] = (T, K)):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    w = torch.randn(N, K, generator=g) / 16
    b = torch.randn(N, generator=g)
    dy = torch.randn(*shape[:-1], N, generator=g)
    return x, w, b, dy


def _run(specs: GemmSpecs | str, *, data=None, bias=True, **cfg):
    """Output and gradients (dx, dw, db) of one forward/backward through the Function."""
    x, w, b, dy = data if data is not None else _data()
    x, w, b = (t.clone().requires_grad_() for t in (x, w, b))
    if isinstance(specs, str):
        specs = GemmSpecs.uniform(specs)
    y = quantized_linear(x, w, b if bias else None, GemmConfig(specs=specs, **cfg))
    y.backward(dy)
    return y.detach(), x.grad, w.grad, b.grad


def _reference(data=None, bias=True):
    x, w, b, dy = data if data is not None else _data()
    x, w, b = (t.clone().requires_grad_() for t in (x, w, b))
    y = F.linear(x, w, b if bias else None)
    y.backward(dy)
    return y.detach(), x.grad, w.grad, b.grad


# --- identity -------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(T, K), (2, 32, K)])
@pytest.mark.parametrize("bias", [True, False])
def test_all_fp32_equals_f_linear_exactly(shape, bias):
    data = _data(shape=shape)
    got, want = _run("fp32", data=data, bias=bias), _reference(data, bias=bias)
    for g, w in zip(got, want, strict=True):
        assert (g is None and w is None) or torch.equal(g, w)


# --- isolation: each GEMM's format touches only its own result ------------------------------

@pytest.mark.parametrize("gemm,changed", [("fprop", 0), ("dgrad", 1), ("wgrad", 2)])
def test_one_gemm_format_changes_only_its_result(gemm, changed):
    specs = GemmSpecs(**{g: ("mxfp4" if g == gemm else "fp32")
                         for g in ("fprop", "dgrad", "wgrad")})
    got, ref = _run(specs), _run("fp32")
    for i in range(3):  # y, dx, dw
        assert torch.equal(got[i], ref[i]) != (i == changed), (gemm, i)
    assert torch.equal(got[3], ref[3])  # the bias gradient is always high precision


def test_fprop_output_uses_fprop_weight_only():
    """fprop quantized with dgrad/wgrad fp32: dX and dW are the exact fp32 gradients."""
    specs = GemmSpecs(fprop="nvfp4", dgrad="fp32", wgrad="fp32")
    y, dx, dw, _ = _run(specs)
    _, dx_ref, dw_ref, _ = _reference()
    assert torch.equal(dx, dx_ref) and torch.equal(dw, dw_ref)


# --- SQNR floors -----------------------------------------------------------------------------

# Measured on this data (x, dY ~ N(0,1), W ~ N(0,1)/16, T x K x N = 64 x 256 x 128, no bias,
# data seed 0, layer seed 1, step 0), in dB, torch 2.13 CPU (`pytest -s -k sqnr` prints them):
#
#   preset               output  dX     dW
#   bf16                 52.62  52.61  52.59
#   fp16                 70.70  70.59  70.64
#   fp8_e4m3             28.58  28.61  28.58
#   fp8_e5m2             22.65  22.41  22.61
#   fp8_e4m3_row         28.75  28.81  28.92   (one scale per row: _scaled_mm rowwise)
#   fp8_e4m3_tile128     28.64  28.59  28.92
#   fp4_e2m1_tile128     15.63  14.10  14.62   (gradients use stochastic rounding)
#   fp4_e2m1_tensor      15.03  13.25  13.16   (one fp32 scale per tensor; SR gradients)
#   mxfp8_e4m3           27.78  27.61  27.57
#   mxfp8_e4m3_rceil     28.60  28.52  28.41
#   mxfp8_e5m2           22.37  22.34  22.25
#   mxfp6_e3m2           22.37  22.34  22.25
#   mxfp6_e2m3           28.07  27.96  27.84
#   mxfp4                15.99  14.12  14.19   (SR gradients)
#   mxfp4_rht            15.80  14.28  14.05   (SR gradients)
#   mxint8               38.67  38.64  38.59
#   nvfp4                16.80  15.11  15.40   (SR gradients)
#   nvfp4_rht            16.62  15.17  15.61   (SR gradients)
#   int8                 40.20  40.75  41.49
#   int4_g32             17.35  17.09  17.27
#
# Floors sit about 2 dB below (stochastic rounding moves the gradient numbers by a few tenths
# of a dB across seeds).  SR costs ~1.5-2 dB of SQNR against RNE but removes the bias.
SQNR_FLOORS = {
    "bf16": (50, 50, 50), "fp16": (68, 68, 68),
    "fp8_e4m3": (26.5, 26.5, 26.5), "fp8_e5m2": (20.5, 20.5, 20.5),
    "fp8_e4m3_row": (26.5, 26.5, 26.5),
    "fp8_e4m3_tile128": (26.5, 26.5, 26.5), "fp4_e2m1_tile128": (13.5, 12, 12.5),
    "fp4_e2m1_tensor": (13, 11, 11),
    "mxfp8_e4m3": (25.5, 25.5, 25.5), "mxfp8_e4m3_rceil": (26.5, 26.5, 26.5),
    "mxfp8_e5m2": (20.5, 20.5, 20.5), "mxfp6_e3m2": (20.5, 20.5, 20.5),
    "mxfp6_e2m3": (26, 26, 26), "mxfp4": (14, 12, 12), "mxfp4_rht": (14, 12, 12),
    "mxint8": (36.5, 36.5, 36.5), "nvfp4": (15, 13, 13.5), "nvfp4_rht": (14.5, 13, 13.5),
    "int8": (38, 38.5, 39.5), "int4_g32": (15.5, 15, 15),
}


def test_every_preset_has_a_floor():
    assert set(SQNR_FLOORS) == set(PRESETS) - {"fp32"}


@pytest.mark.parametrize("preset", sorted(SQNR_FLOORS))
def test_sqnr_floor(preset):
    ref = _run("fp32", seed=1, bias=False)  # the GEMM itself: a bias would inflate output SQNR
    got = _run(preset, seed=1, bias=False)
    measured = [sqnr_db(r, g) for r, g in zip(ref[:3], got[:3], strict=True)]
    out, dx, dw = measured
    print(f"\nSQNR {preset:18s} out {out:6.2f}  dX {dx:6.2f}  dW {dw:6.2f}")
    for name, m, floor in zip(("output", "dX", "dW"), measured, SQNR_FLOORS[preset], strict=True):
        assert m >= floor, f"{preset} {name}: {m:.2f} dB under the floor {floor} dB"


# --- stochastic rounding seeds ----------------------------------------------------------------

def test_stochastic_rounding_is_reproducible_per_seed_and_step():
    a = _run("mxfp4", seed=7, step=3)
    b = _run("mxfp4", seed=7, step=3)
    c = _run("mxfp4", seed=7, step=4)
    d = _run("mxfp4", seed=8, step=3)
    assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
    assert torch.equal(a[0], c[0])  # the forward rounds to nearest: no noise
    for other in (c, d):
        assert not torch.equal(a[1], other[1]) and not torch.equal(a[2], other[2])


def test_stochastic_gradient_is_unbiased_on_average():
    """Averaging SR gradients over steps approaches the RNE-free fp32-weight gradient."""
    specs = GemmSpecs(fprop="fp32", dgrad="fp32", wgrad="mxfp4")
    ref = _run("fp32")[2]
    one = _run(specs, step=0)[2]
    mean = torch.stack([_run(specs, step=s)[2] for s in range(16)]).mean(0)
    assert sqnr_db(ref, mean) > sqnr_db(ref, one) + 3


# --- save modes -------------------------------------------------------------------------------

@pytest.mark.parametrize("specs", [
    GemmSpecs.uniform("mxfp4"), GemmSpecs.uniform("nvfp4"), GemmSpecs.uniform("fp8_e4m3"),
    GemmSpecs(fprop="nvfp4", dgrad="mxfp8_e4m3", wgrad="fp4_e2m1_tile128"),
    GemmSpecs(fprop="mxfp4", dgrad="fp32", wgrad="nvfp4_rht"),
])
def test_encoded_save_gives_identical_gradients_and_fewer_bytes(specs):
    rec_hp, rec_enc = SavedBytes(), SavedBytes()
    x, w, b, dy = _data()
    outs = []
    for save, rec in ((SaveMode.HP, rec_hp), (SaveMode.ENCODED, rec_enc)):
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = quantized_linear(xs, ws, b, GemmConfig(specs=specs, seed=3, save=save), rec)
        y.backward(dy)
        outs.append((y.detach(), xs.grad, ws.grad))
    for u, v in zip(*outs, strict=True):
        assert torch.equal(u, v)
    assert rec_enc.activation < rec_hp.activation
    bf16_bytes = T * K * 2
    if specs.wgrad.bits == 4 and T % specs.wgrad.block == 0:  # 1x128 tiles pad T=64 to 128
        assert rec_enc.activation <= 0.35 * bf16_bytes


@pytest.mark.parametrize("specs", [
    *(GemmSpecs.uniform(p) for p in sorted(PRESETS)),
    GemmSpecs(fprop="nvfp4", dgrad="mxfp8_e4m3", wgrad="fp4_e2m1_tile128"),
    GemmSpecs(fprop="mxfp4", dgrad="fp32", wgrad="nvfp4_rht"),
    GemmSpecs(fprop="fp32", dgrad="bf16", wgrad="fp8_e4m3"),
], ids=lambda s: f"{s.fprop.name}-{s.dgrad.name}-{s.wgrad.name}")
def test_default_settings_path_equals_the_general_path(specs, monkeypatch):
    """``SaveMode.HP`` with emulated GEMMs (the defaults) takes ``hp_forward``/``hp_backward``,
    every other setting the general functions, which handle HP too: both give the same bits
    (output, the three gradients, the saved-byte record) on every preset, for a 3-D input,
    stochastic gradients at a later step, placed tokens, bf16 GEMM operands, a bf16 input, a
    bias or none, and backward through one of the two inputs only."""
    from snip.nn import gemm
    x, w, b, dy = _data(seed=5, shape=(2, 32, K))
    cases = [dict(seed=3, step=7), dict(seed=1, tokens=RowShard(64, 192)),
             dict(accum=Accum.BF16), dict(bias=False), dict(dtype=torch.bfloat16)]

    def run(grads: str, bias=True, dtype=torch.float32, **cfg):
        rec = SavedBytes(activation=-1, weight=-1)
        xs, ws, bs = x.to(dtype, copy=True).requires_grad_("x" in grads), w.clone().requires_grad_(
            "w" in grads), b.clone().requires_grad_()
        y = quantized_linear(xs, ws, bs if bias else None, GemmConfig(specs=specs, **cfg), rec)
        y.backward(dy.to(y.dtype))
        return [y.detach(), xs.grad, ws.grad, bs.grad if bias else None,
                torch.tensor([rec.activation, rec.weight])]

    for case in cases:
        for grads in ("xw", "x", "w"):
            straight = run(grads, **case)
            with monkeypatch.context() as m:
                m.setattr(gemm, "plain_route", lambda cfg: False)
                general = run(grads, **case)
            for u, v in zip(straight, general, strict=True):
                assert (u is None and v is None) or torch.equal(u, v), (case, grads)
    assert gemm.plain_route(GemmConfig(specs=specs))
    assert not gemm.plain_route(GemmConfig(specs=specs, save="encoded"))
    assert not gemm.plain_route(GemmConfig(specs=specs, gemm="native"))


def test_weight_reuse_rule():
    assert weight_reusable(get_spec("nvfp4"), get_spec("nvfp4"))          # 16x16 tiles
    assert weight_reusable(get_spec("fp8_e4m3"), get_spec("fp8_e4m3"))    # one tensor scale
    assert not weight_reusable(get_spec("mxfp4"), get_spec("mxfp4"))      # 1x32 along an axis
    assert not weight_reusable(get_spec("nvfp4"), get_spec("fp4_e2m1_tile128"))
    assert not weight_reusable(get_spec("nvfp4_rht"), get_spec("nvfp4_rht"))


def test_reused_weight_matches_requantized_weight():
    """nvfp4 fprop+dgrad (reused Q(W)) gives the dX of a dgrad-only nvfp4 layer."""
    both = _run(GemmSpecs(fprop="nvfp4", dgrad="nvfp4", wgrad="fp32"))
    dgrad_only = _run(GemmSpecs(fprop="fp32", dgrad="nvfp4", wgrad="fp32"))
    assert torch.equal(both[1], dgrad_only[1])


# --- dtypes and shapes ------------------------------------------------------------------------

def test_autocast_bf16_output_dtype_and_grad_dtypes():
    x, w, b, dy = _data(shape=(2, 32, K))
    x, w, b = (t.clone().requires_grad_() for t in (x, w, b))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cfg = GemmConfig(specs=GemmSpecs.uniform("mxfp4"), out_dtype=torch.bfloat16)
        y = quantized_linear(x, w, b, cfg)
    assert y.dtype == torch.bfloat16 and y.shape == (2, 32, N)
    y.backward(dy.bfloat16())
    assert x.grad.dtype == w.grad.dtype == b.grad.dtype == torch.float32
    ref = _run("mxfp4", data=(x.detach(), w.detach(), b.detach(), dy))
    assert sqnr_db(ref[0], y.detach().float()) > 40  # only the bf16 output rounding differs


def test_bf16_input_without_autocast_keeps_bf16():
    x, w, b, dy = _data()
    xb = x.bfloat16().requires_grad_()
    y = quantized_linear(xb, w, b, GemmConfig(specs=GemmSpecs.uniform("nvfp4")))
    y.backward(dy.bfloat16())
    assert y.dtype == xb.grad.dtype == torch.bfloat16


def test_bf16_accumulation_is_close_to_fp32():
    fp32 = _run("mxfp4", seed=1)
    bf16 = _run("mxfp4", seed=1, accum=Accum.BF16)
    for a, b in zip(fp32[:3], bf16[:3], strict=True):
        assert 35 < sqnr_db(a, b) < float("inf")


def test_three_d_input_matches_flattened():
    x, w, b, dy = _data(shape=(4, 16, K))
    flat = (x.reshape(-1, K), w, b, dy.reshape(-1, N))
    a, f = _run("nvfp4", data=(x, w, b, dy), seed=2), _run("nvfp4", data=flat, seed=2)
    assert torch.equal(a[0].reshape(-1, N), f[0]) and torch.equal(a[1].reshape(-1, K), f[1])
    assert torch.equal(a[2], f[2])


def test_no_grad_forward_saves_nothing():
    x, w, b, _ = _data()
    rec = SavedBytes(activation=-1)
    with torch.no_grad():
        quantized_linear(x, w, b, GemmConfig(specs=GemmSpecs.uniform("mxfp4")), rec)
    assert rec.activation == 0 and rec.weight == 0


@pytest.mark.parametrize("preset", ["mxfp4", "nvfp4", "bf16", "fp8_e4m3_tile128"])
def test_backward_twice_with_retain_graph(preset):
    """A second backward through one forward (``retain_graph=True``) gets the same gradients
    as the first, as through ``nn.Linear`` (the same SR seeds: the step is the forward's);
    with packed operands (``save='encoded'``), freed by the first, it is a clear error."""
    x, w, b, _ = _data()
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = quantized_linear(x, w, b, GemmConfig(specs=GemmSpecs.uniform(preset))).square().sum()
    y.backward(retain_graph=True)
    first = (x.grad.clone(), w.grad.clone())
    y.backward()
    assert torch.equal(x.grad, 2 * first[0]) and torch.equal(w.grad, 2 * first[1])
    y = quantized_linear(x, w, b, GemmConfig(specs=GemmSpecs.uniform(preset),
                                             save="encoded")).sum()
    y.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward"):
        y.backward()


def test_feature_mismatch_is_a_value_error():
    x, w, b, _ = _data()
    with pytest.raises(ValueError, match="features"):
        quantized_linear(x[:, :100], w, b, GemmConfig(specs=GemmSpecs.uniform("fp32")))


def test_bf16_exact_claims_hold():
    """``bf16_exact`` specs give operands that survive a cast to bf16 bit for bit (so a bf16
    GEMM multiplies exactly what the fp32 GEMM multiplies); the others are not claimed."""
    from snip.nn.gemm import bf16_exact

    claimed = {n for n, s in PRESETS.items() if bf16_exact(s)}
    assert {"mxfp4", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp8_e4m3", "mxfp8_e5m2", "mxint8",
            "bf16"} <= claimed
    assert not claimed & {"nvfp4", "fp8_e4m3", "fp8_e4m3_tile128", "fp4_e2m1_tile128", "fp32",
                          "int8", "mxfp4_rht"}
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 256, generator=g) * torch.logspace(-6, 6, 256)
    for name in claimed:
        for axis in (-1, 0):
            q = quantize(x, name, axis=axis, rounding="stochastic", generator=1)
            assert torch.equal(q.bfloat16().float(), q), name
    q = quantize(x, "fp8_e4m3_tile128")
    assert not torch.equal(q.bfloat16().float(), q)  # a claim there would be false


@pytest.mark.parametrize("native", ["0", "1"])
def test_auto_accum_follows_the_hardware(native, monkeypatch):
    from snip.nn.gemm import bf16_gemm_native

    monkeypatch.setenv("SNIP_BF16_GEMM", native)
    assert bf16_gemm_native() is (native == "1")
    auto = _run("mxfp4", seed=1, accum=Accum.AUTO)
    same = _run("mxfp4", seed=1, accum=Accum.BF16 if native == "1" else Accum.FP32)
    for a, b in zip(auto, same, strict=True):
        assert torch.equal(a, b)


def test_bf16_gemm_differs_from_fp32_only_by_output_rounding():
    """On bf16-exact operands the bf16 GEMM's error is that of rounding the fp32 result to bf16
    (plus summation order): within 2 bf16 ulps of the fp32 GEMM, element by element."""
    g = torch.Generator().manual_seed(3)
    a = quantize(torch.randn(64, 512, generator=g), "mxfp4")
    b = quantize(torch.randn(512, 48, generator=g), "mxfp4", axis=0)
    ref = a.double() @ b.double()
    got = matmul(a, b, Accum.BF16).double()
    ulp = ref.abs().clamp(min=1e-30) * 2.0**-8
    scale = (a.abs().double() @ b.abs().double()) * 2.0**-20  # cancellation: summation error
    assert ((got - ref).abs() <= 2 * ulp + scale).all()


@pytest.mark.parametrize("preset", ["bf16", "fp8_e4m3", "fp8_e4m3_tile128", "mxfp8_e4m3",
                                    "mxfp4", "nvfp4", "fp4_e2m1_tile128", "fp4_e2m1_tensor"])
def test_bf16_gemm_operands_made_in_bf16_change_no_bit(preset, monkeypatch):
    """With bf16 GEMMs every quantized operand is made in bf16 by the quantizer itself (one pass,
    half the bytes): output and gradients equal, bit for bit, those of fp32 operands that the
    GEMM casts to bf16 (the path before the shortcut)."""
    import snip.nn.gemm as gemm

    dtypes = []
    real = gemm.quantize_operand
    shortcut = [True]

    def spy(*a, **k):
        out = real(*a, **{**k, "bf16": k.get("bf16", False) and shortcut[0]})
        dtypes.append(out.dtype if not a[1].is_identity else None)
        return out

    monkeypatch.setattr(gemm, "quantize_operand", spy)
    data = _data(seed=2, shape=(2, 32, K))
    got = _run(preset, data=data, seed=5, accum=Accum.BF16)
    assert dtypes and set(dtypes) == {torch.bfloat16}  # the shortcut was taken
    shortcut[0] = False  # fp32 operands, which the bf16 GEMM casts
    dtypes.clear()
    want = _run(preset, data=data, seed=5, accum=Accum.BF16)
    assert set(dtypes) == {torch.float32}
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("forward", ["0", "1"])
def test_auto_accum_is_decided_once_per_forward(forward, monkeypatch):
    """Backward multiplies in the precision forward chose (and made the operands for), even if
    the hardware switch changes in between."""
    x, w, b, dy = _data(seed=4)
    outs = []
    for flip in (False, True):
        monkeypatch.setenv("SNIP_BF16_GEMM", forward)
        xr, wr, br = (t.clone().requires_grad_() for t in (x, w, b))
        y = quantized_linear(xr, wr, br, GemmConfig(specs=GemmSpecs.uniform("mxfp4"),
                                                    accum=Accum.AUTO))
        if flip:
            monkeypatch.setenv("SNIP_BF16_GEMM", "1" if forward == "0" else "0")
        y.backward(dy)
        outs.append((xr.grad, wr.grad))
    for a, c in zip(*outs, strict=True):
        assert torch.equal(a, c)


@pytest.mark.skipif("not fast.enabled()", reason="fast path off (numba not installed)")
@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("preset", ["mxfp4", "nvfp4", "fp4_e2m1_tensor"])
def test_placed_tokens_take_the_planned_call_with_their_coins(preset, axis, monkeypatch):
    """Tokens placed in a larger batch (one rank's, or a micro-batch's: ``QLinear.tokens``)
    take the one planned kernel call (:func:`snip.formats.fast.planned`), never ``quantize``'s
    general path, with the bits ``quantize`` gives with that shard: the whole batch draws the
    unplaced coins, a shard at the batch's start or in its middle its own (along tokens its
    counters stride by the whole batch's padded length); round-to-nearest draws none.  A shard
    that does not fit raises."""
    import snip.nn.gemm as gemm

    planned, general = [], []
    real = fast.planned
    monkeypatch.setattr(fast, "planned", lambda *a: planned.append((a[3], a[5])) or real(*a))
    monkeypatch.setattr(gemm, "quantize", lambda *a, **k: general.append(a) or quantize(*a, **k))
    x = torch.randn(96, 64, generator=torch.Generator().manual_seed(3))
    spec, sr = get_spec(preset), Rounding.STOCHASTIC
    unplaced = quantize(x, spec, axis=axis, rounding=sr, generator=11)
    whole = RowShard(0, 96)
    got = gemm.quantize_operand(x, spec, axis, sr, 11, whole)
    assert planned == [(sr, whole)] and torch.equal(got, unplaced)
    middle = RowShard(96, 288)
    for shard in (RowShard(0, 192), middle):
        got = gemm.quantize_operand(x, spec, axis, sr, 11, shard)
        want = quantize(x, spec, axis=axis, rounding=sr, generator=11, shard=shard)
        assert planned[-1] == (sr, shard) and torch.equal(got, want)
    assert not torch.equal(got, unplaced)  # (the middle shard's coins)
    with pytest.raises(ValueError, match="do not fit"):  # rows 5..100 of 96
        gemm.quantize_operand(x, spec, axis, sr, 11, RowShard(5, 96))
    got = gemm.quantize_operand(x, spec, axis, Rounding.RNE, 11, middle)
    assert planned[-1] == (Rounding.RNE, middle) and len(planned) == 5 and general == []
    assert torch.equal(got, quantize(x, spec, axis=axis, rounding=Rounding.RNE))
