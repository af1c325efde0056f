"""The fused numba path is bit-identical to the PyTorch path (which the other tests pin)."""

import itertools
import os

import pytest
import torch

from snip.formats import PRESETS, Scaling, encode, fast, get_spec, quantize
from snip.formats.cast import draw_key
from snip.formats.scaling import RowShard

pytestmark = pytest.mark.skipif("not fast.enabled()",
                                reason="fast path off (numba not installed or SNIP_FAST=0)")

BLOCKED = [n for n, s in PRESETS.items() if s.scaling is not Scaling.NONE]


def inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 256, generator=g) * torch.logspace(-8, 8, 256)
    x[3, :40] = 0.0
    x[5, 7] = float("nan")
    x[6, 9] = float("inf")
    x[7] = torch.randint(-24, 25, (256,), generator=g) / 4  # ties
    x[8, :] = 1e-41  # fp32 subnormals
    return [x, torch.randn(3, 5, 70, generator=g), torch.randn(2, 16384, generator=g),
            x.bfloat16(), torch.randn(4, 40, 33, generator=g).bfloat16()]


def both_paths(fn, monkeypatch):
    fast_out = fn()
    monkeypatch.setattr(fast, "enabled", lambda: False)
    slow_out = fn()
    monkeypatch.undo()
    return fast_out, slow_out


@pytest.mark.parametrize("preset", BLOCKED)
@pytest.mark.parametrize("rounding", ["rne", "stochastic"])
def test_fast_equals_torch_path(preset, rounding, monkeypatch):
    for x in inputs():
        for axis in (-1, 0, 1) if x.dim() == 3 else (-1, 0):
            a, b = both_paths(
                lambda x=x, axis=axis: quantize(
                    x, preset, axis=axis, rounding=rounding, generator=3
                ),
                monkeypatch,
            )
            assert a.dtype == b.dtype == x.dtype
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("preset", ["mxfp4", "nvfp4", "fp8_e4m3", "mxint8"])
def test_fast_encode_equals_torch_path(preset, monkeypatch):
    x = inputs()[1]
    a, b = both_paths(lambda: encode(x, preset), monkeypatch)
    assert torch.equal(a.codes, b.codes) and torch.equal(
        a.scales.view(torch.uint8), b.scales.view(torch.uint8)
    )


TILED = [n for n, s in PRESETS.items() if s.for_weight().scaling is Scaling.BLOCK2D]


@pytest.mark.parametrize("preset", TILED)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weight_tiles_fast(preset, dtype, monkeypatch):
    """2-D weight tiles (fused kernel for RNE, blocked path for SR) equal the reference path:
    partial edge tiles, NaN/inf tiles, zero tiles, a matrix with no finite tile, both axes."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(200, 300, generator=g) * torch.logspace(-6, 6, 300)
    w[:16, :16] = 0.0
    w[20, 40] = float("nan")
    w[150, 290] = float("-inf")
    spec = get_spec(preset).for_weight()
    monkeypatch.setattr(fast, "_PARALLEL_MIN", 0)
    for m in (w, torch.randn(17, 129, generator=g), torch.full((32, 32), float("inf"))):
        m = m.to(dtype)
        for axis in (-1, 0):
            for rounding in ("rne", "stochastic"):
                a, b = both_paths(lambda m=m, axis=axis, r=rounding: quantize(
                    m, spec, axis=axis, rounding=r, generator=4), monkeypatch)
                monkeypatch.setattr(fast, "_PARALLEL_MIN", 0)
                assert a.dtype == b.dtype == dtype
                torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    assert fast.fusable(w, spec, fast.Rounding.RNE) == (not spec.hadamard)
    assert not fast.fusable(w, spec, fast.Rounding.STOCHASTIC) and not fast.fusable(w, spec)


def test_kernels_leave_torch_thread_count_alone():
    """numba's OpenMP launch resets omp threads; the fast path must restore torch's setting.
    A fresh process, because the launch happens once per process."""
    import subprocess
    import sys

    code = ("import torch, snip; torch.set_num_threads(1); "
            "snip.quantize(torch.randn(64, 64), 'mxfp4'); print(torch.get_num_threads())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"


def test_fused_path_is_taken():
    """The cases above must exercise the fused kernel, not fall back (a silent fallback would
    make the comparison vacuous)."""
    for x in inputs():
        for preset in ("mxfp4", "nvfp4", "fp8_e4m3", "fp8_e4m3_tile128", "int8"):
            assert fast.fusable(x, get_spec(preset))
    assert not fast.fusable(torch.randn(8, 32), get_spec("mxfp4_rht"))
    assert not fast.fusable(torch.randn(8, 32).half(), get_spec("mxfp4"))


def test_numba_cpu_model(monkeypatch):
    """The LLVM CPU model the kernels are tuned for: ``x86-64-v3`` where numba would tune for an
    Intel AVX-512 model, numba's own choice elsewhere; ``SNIP_NUMBA_CPU`` overrides (``host``:
    numba's choice), a user's ``NUMBA_CPU_NAME`` wins over both; and a fresh process importing
    snip compiles with it."""
    import subprocess
    import sys

    names = ("NUMBA_CPU_NAME", "SNIP_NUMBA_CPU")
    before = {name: os.environ.get(name) for name in names}
    for name in names:
        # ``numba_cpu`` writes os.environ itself: a set first records the value (or absence)
        # that undo must restore, which a delenv of an absent variable does not record
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    for model, want in (("rocketlake", "x86-64-v3"), ("sapphirerapids", "x86-64-v3"),
                        ("znver4", None), ("haswell", None), ("", None)):
        monkeypatch.setattr(fast, "_host_cpu_model", lambda m=model: m)
        assert fast.numba_cpu() == want, model
        monkeypatch.delenv("NUMBA_CPU_NAME", raising=False)
    monkeypatch.setenv("SNIP_NUMBA_CPU", "host")
    assert fast.numba_cpu() is None
    monkeypatch.setenv("SNIP_NUMBA_CPU", "skylake")
    assert fast.numba_cpu() == "skylake"  # on any host
    monkeypatch.setenv("NUMBA_CPU_NAME", "haswell")
    assert fast.numba_cpu() == "haswell"
    monkeypatch.undo()
    # a leaked model would make every later process recompile every kernel (~2 min, issue 21)
    assert {name: os.environ.get(name) for name in names} == before
    expected = "x86-64-v3" if fast._host_cpu_model() in fast._INTEL_AVX512_MODELS else None
    code = ("import os; os.environ.pop('NUMBA_CPU_NAME', None); os.environ.pop('SNIP_NUMBA_CPU', "
            "None); import snip.formats.fast, numba; print(numba.config.CPU_NAME)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(expected)


def test_kernel_for_picks_each_kernel(monkeypatch):
    """``kernel_for``, the one choice both quantizer callers make: the bf16 cast for the bf16
    preset on fp32 CPU data (round-to-nearest only), the fused kernel for block formats (tiles:
    RNE matrices only), none otherwise; the spec's part is cached, the input's part is not."""
    K, R = fast.Kernel, fast.Rounding
    x = torch.randn(8, 32)
    bf16, mx, tile = get_spec("bf16"), get_spec("mxfp4"), get_spec("fp4_e2m1_tile128").for_weight()
    assert fast.kernel_for(x, bf16, R.RNE) is K.BF16
    assert fast.kernel_for(x, bf16, R.STOCHASTIC) is K.NONE
    assert fast.kernel_for(x.bfloat16(), bf16, R.RNE) is K.NONE
    assert fast.kernel_for(x, mx, R.STOCHASTIC) is fast.kernel_for(x.bfloat16(), mx, R.RNE) \
        is K.FUSED
    assert fast.kernel_for(x, tile, R.RNE) is K.FUSED
    assert fast.kernel_for(x, tile, R.STOCHASTIC) is fast.kernel_for(x, tile, None) is K.NONE
    assert fast.kernel_for(x.reshape(2, 4, 32), tile, R.RNE) is K.NONE
    assert fast.kernel_for(x[:0], mx, R.RNE) is fast.kernel_for(x.half(), mx, R.RNE) is K.NONE
    assert fast.kernel_for(x, get_spec("fp32"), R.RNE) is K.NONE
    monkeypatch.setenv("SNIP_FAST", "0")  # read on every call, after the spec's part is cached
    assert fast.kernel_for(x, bf16, R.RNE) is fast.kernel_for(x, mx, R.RNE) is K.NONE
    monkeypatch.setenv("SNIP_FAST", "1")
    assert fast.kernel_for(x, mx, R.RNE) is K.FUSED


def test_planned_is_kernel_for_and_quantize_in_one_call(monkeypatch):
    """``planned``, the GEMM operands' entry: a call exactly where ``kernel_for`` picks a kernel
    (remembered per kind; the device and ``SNIP_FAST`` still read on every call), whose result
    is ``quantize``'s in the asked dtype, bit for bit, with the same object ``quantize_fused``
    runs for that kind."""
    R = fast.Rounding
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 96, generator=g) * 3
    x[1, 5] = float("nan")
    specs = [get_spec(n) for n in ("bf16", "mxfp4", "nvfp4", "fp8_e4m3", "fp32")]
    specs.append(get_spec("fp4_e2m1_tile128").for_weight())
    for spec, axis, rounding, src, dtype in itertools.product(
            specs, (-1, 0), (R.RNE, R.STOCHASTIC), (x, x.bfloat16(), x[:0]),
            (torch.float32, torch.bfloat16)):
        call = fast.planned(src, spec, axis, rounding, dtype)
        kernel = fast.kernel_for(src, spec, rounding)
        # quantize() rounds bf16 data in bf16 and only then widens it: no one-pass call
        widens = (src.dtype, dtype) == (torch.bfloat16, torch.float32)
        assert (call is None) == (kernel is fast.Kernel.NONE or widens), (spec.name, rounding)
        assert fast.planned(src, spec, axis, rounding, dtype) is call
        if call is None:
            continue
        want = quantize(src, spec, axis=axis, rounding=rounding, generator=11, dtype=dtype)
        got = call(src, 11)
        assert got.dtype == dtype and torch.equal(got.float().nan_to_num(7.0),
                                                  want.float().nan_to_num(7.0))
        assert torch.equal(got.isnan(), want.isnan())
        if kernel is fast.Kernel.FUSED:  # quantize_fused's call of that kind is this one
            assert fast._PLANS[(spec, src.shape, axis, rounding is R.STOCHASTIC, None, src.dtype,
                                dtype)] is call
    mx = get_spec("mxfp4")
    assert fast.planned(x.to("meta"), mx, -1, R.RNE, torch.float32) is None  # same kind, not CPU
    assert fast.planned(x.reshape(2, 32, 96), get_spec("nvfp4").for_weight(), -1, R.RNE,
                        torch.float32) is None  # tiles: matrices only
    monkeypatch.setenv("SNIP_FAST", "0")
    assert fast.planned(x, mx, -1, R.RNE, torch.float32) is None
    monkeypatch.setenv("SNIP_FAST", "1")
    assert fast.planned(x, mx, -1, R.RNE, torch.float32) is not None


@pytest.mark.parametrize("preset", ["mxfp4", "nvfp4", "fp8_e4m3", "mxfp8_e4m3"])
def test_planned_with_a_shard_is_quantize_with_that_shard(preset, monkeypatch):
    """``planned`` with a row shard (one rank's tokens, or a micro-batch): stochastic rounding
    draws the coins of those rows of the larger tensor, the bits of the reference path
    (``SNIP_FAST=0``) quantizing with that shard, in either output dtype and along either axis;
    the call is kept per shard, a shard that is the whole tensor and any shard under
    round-to-nearest take the unplaced call, and a shard that does not fit raises on every
    call, as ``quantize`` does."""
    from snip.formats import Rounding, RowShard

    R = Rounding
    spec = get_spec(preset)
    x = torch.randn(64, 96, generator=torch.Generator().manual_seed(5)) * 3
    shards = (RowShard(0, 128), RowShard(64, 192), RowShard(96, 320))
    cases = list(itertools.product((-1, 0), shards, (torch.float32, torch.bfloat16)))
    monkeypatch.setenv("SNIP_FAST", "0")
    want = [quantize(x, spec, axis=axis, rounding=R.STOCHASTIC, generator=11, shard=shard,
                     dtype=dtype) for axis, shard, dtype in cases]
    monkeypatch.setenv("SNIP_FAST", "1")
    for (axis, shard, dtype), w in zip(cases, want, strict=True):
        call = fast.planned(x, spec, axis, R.STOCHASTIC, dtype, shard)
        assert call is not None and fast.planned(x, spec, axis, R.STOCHASTIC, dtype, shard) is call
        assert call is not fast.planned(x, spec, axis, R.STOCHASTIC, dtype)
        got = call(x, 11)
        assert got.dtype == dtype and torch.equal(got, w), (axis, shard, dtype)
        unplaced = fast.planned(x, spec, axis, R.RNE, dtype)
        assert fast.planned(x, spec, axis, R.RNE, dtype, shard) is unplaced
    assert not torch.equal(want[0], want[2])  # (two shards, two sets of coins)
    for axis in (-1, 0):
        unplaced = fast.planned(x, spec, axis, R.STOCHASTIC, torch.float32)
        assert fast.planned(x, spec, axis, R.STOCHASTIC, torch.float32, RowShard(0, 64)) is unplaced
        for _ in range(2):
            with pytest.raises(ValueError, match="do not fit"):
                fast.planned(x, spec, axis, R.STOCHASTIC, torch.float32, RowShard(8, 64))


def test_env_reader_follows_os_environ(monkeypatch):
    """The look-up :func:`fast.enabled` uses sees every change made through ``os.environ``, and
    an ``os.environ`` without CPython's encoded dictionary falls back to ``os.environ.get``."""
    read = fast._env_reader("SNIP_TEST_ENV_READER")
    monkeypatch.delenv("SNIP_TEST_ENV_READER", raising=False)
    assert read() is None
    monkeypatch.setenv("SNIP_TEST_ENV_READER", "0")
    assert read() == "0"
    os.environ["SNIP_TEST_ENV_READER"] = "é1"
    assert read() == "é1"
    monkeypatch.delenv("SNIP_TEST_ENV_READER")
    assert read() is None
    monkeypatch.setattr(os, "environ", {"SNIP_TEST_ENV_READER": "x"})
    plain = fast._env_reader("SNIP_TEST_ENV_READER")
    assert plain() == "x"
    os.environ["SNIP_TEST_ENV_READER"] = "y"
    assert plain() == "y"


def test_kernel_uniforms_equal_counter_uniforms():
    """Three implementations of one stream: the pure-Python definition, the torch reference
    path and the numba kernels' scalar form (the pair forms inside the span kernels are checked
    against it by ``test_sr_span_equals_scalar_rounding`` and the block-kernel tests)."""
    from snip.formats.cast import counter_uniforms

    key = (123456789, 987654321)
    for base in (0, 1, 7, 5 << 32, (1 << 33) - 3, (1 << 40) + 12345):
        idx = torch.arange(base, base + 4096, dtype=torch.int64)
        ref = counter_uniforms(idx, key)
        got = torch.tensor([fast._u01(int(i), *key) for i in idx[:64]])
        py = torch.tensor([fast.sr_uniform_reference(key, int(i)) for i in idx[:64]])
        assert torch.equal(got, ref[:64]) and torch.equal(py, ref[:64])
        assert ref.min() >= 0 and ref.max() < 1


def test_reference_uniforms_pinned():
    """The stream is a cross-implementation contract (the GPU port must match it): pin a few
    values of the definition so that an accidental change cannot pass unnoticed."""
    key = (1, 2)
    bits = [int(fast.sr_uniform_reference(key, i) * 2**16) for i in range(4)]
    h0 = fast._mix32(fast._mix32(0 ^ 1) + 2)  # pair 0: elements 0 (low half) and 1 (high half)
    h1 = fast._mix32(fast._mix32(1 ^ 1) + 2)
    assert bits == [h0 & 0xFFFF, h0 >> 16, h1 & 0xFFFF, h1 >> 16]
    seeded = fast.sr_uniform_reference(5, 3)
    assert seeded == fast.sr_uniform_reference(draw_key(torch.Generator().manual_seed(5)), 3)


def test_uniforms_look_uniform():
    from snip.formats.cast import counter_uniforms

    n = 1 << 20
    for key in ((7, 11), (0, 0), (2**31 - 1, 12345)):
        u = counter_uniforms(torch.arange(n), key).double()
        assert abs(u.mean().item() - 0.5) < 4 * (1 / 12 / n) ** 0.5
        hist = torch.histc(u, bins=64, min=0, max=1)
        expected = n / 64
        chi2 = ((hist - expected) ** 2 / expected).sum().item()
        assert chi2 < 120  # 63 degrees of freedom: p ~ 1e-5
        # neighbours (the two halves of one hash, and across pairs) are uncorrelated
        for lag in (1, 2, 3, 4096):
            c = ((u[lag:] - 0.5) * (u[:-lag] - 0.5)).mean().item() * 12
            assert abs(c) < 0.01, (key, lag, c)
        for start in (0, 1):  # joint law of (u_j, u_j+1) on an 8x8 grid, both alignments
            a = (u[start::2][: n // 2 - 1] * 8).long()
            b = (u[start + 1::2][: n // 2 - 1] * 8).long()
            joint = torch.bincount(a * 8 + b, minlength=64).double()
            e = joint.sum() / 64
            assert ((joint - e) ** 2 / e).sum().item() < 120, (key, start)


def test_stochastic_rounding_probability_resolution():
    """16 random bits: P(round up) is frac rounded up to a multiple of 2^-16, so a value 1/3 of
    a step above a grid point rounds up with probability 1/3 within 2^-16 plus noise."""
    n = 1 << 20
    x = torch.full((n,), 2.0 + 1 / 12)  # e4m3 step in [2, 4) is 0.25: frac 1/3
    x[0] = 448.0  # per-tensor scale 1
    y = quantize(x, "fp8_e4m3", rounding="stochastic", generator=1)[1:]
    assert sorted(y.unique().tolist()) == [2.0, 2.25]
    frac = (x[1].item() - 2.0) / 0.25
    up = (y == 2.25).double().mean().item()
    assert abs(up - frac) < 2.0**-16 + 5 * (frac * (1 - frac) / n) ** 0.5


@pytest.mark.parametrize("preset", ["mxfp4", "nvfp4", "fp4_e2m1_tile128", "fp8_e4m3"])
def test_stochastic_rounding_identical_across_thread_counts(preset, monkeypatch):
    monkeypatch.setattr(fast, "_PARALLEL_MIN", 0)  # small tensors would run on one thread
    x = torch.randn(300, 512, generator=torch.Generator().manual_seed(1))
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            outs.append([quantize(x, preset, axis=a, rounding="stochastic", generator=9)
                         for a in (-1, 0)])
    finally:
        torch.set_num_threads(before)
    for other in outs[1:]:
        for a, b in zip(outs[0], other, strict=True):
            assert torch.equal(a, b)


def test_output_buffers_are_recycled_but_never_shared():
    x = torch.randn(1024, 1024)
    a = quantize(x, "mxfp4")
    a_copy = a.clone()
    ptr = a.data_ptr()
    b = quantize(x * 2, "mxfp4")  # a is alive: b must get other memory
    assert b.data_ptr() != ptr and torch.equal(a, a_copy)
    del a
    c = quantize(x, "mxfp4")  # a's buffer came back to the cache: reused
    assert c.data_ptr() == ptr and torch.equal(c, a_copy)
    c.add_(1)  # the result is an ordinary writable tensor
    fast.release_buffers()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nvfp4_first_pass_edge_cases(dtype, monkeypatch):
    """NVFP4 over whole blocks takes the two-pass path (block maxima stored by the first pass):
    blocks that are all NaN/inf, a tensor with no finite block, zeros, a 1-D tensor, and a size
    that spans several parallel groups."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(64, 512, generator=g) * 100
    x[0, :16] = float("nan")
    x[1, 16:32] = float("-inf")
    x[2] = 0.0
    cases = [x, torch.full((4, 32), float("nan")), torch.zeros(2, 64),
             torch.randn(48, generator=g), torch.randn(9, 16 * 700, generator=g) * 1e-3]
    monkeypatch.setattr(fast, "_PARALLEL_MIN", 0)
    for case in cases:
        case = case.to(dtype)
        for rounding in ("rne", "stochastic"):
            a, b = both_paths(lambda c=case, r=rounding: quantize(c, "nvfp4", rounding=r,
                                                                  generator=2), monkeypatch)
            monkeypatch.setattr(fast, "_PARALLEL_MIN", 0)
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


def test_kernels_leave_the_input_storage_resizable() -> None:
    """FSDP2 frees a gathered weight by resizing its storage to 0; ``Tensor.numpy()`` would
    forbid that for good, so the kernels view their inputs through the data pointer."""
    w = torch.nn.Parameter(torch.randn(64, 64))
    for preset, axis in [("mxfp4", -1), ("mxfp4", 0), ("nvfp4", -1), ("fp8_e4m3", -1)]:
        quantize(w.detach(), preset, axis=axis, rounding="stochastic", generator=1)
    quantize(w.detach(), get_spec("nvfp4").for_weight())
    assert w.untyped_storage().resizable()
    w.untyped_storage().resize_(0)


def _span_inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(300, generator=g) * torch.logspace(-6, 3, 300)
    x[3], x[4], x[5], x[6] = float("nan"), float("inf"), float("-inf"), 0.0
    x[7], x[8], x[9] = -0.0, 1e-41, 3e38
    x[10:30] = torch.randint(-40, 41, (20,), generator=g) / 8  # grid points and ties
    return [x, x.bfloat16()]


@pytest.mark.parametrize("per_element", [False, True])
def test_sr_span_equals_scalar_rounding(per_element):
    """The pair-hashing SR span (odd start, odd end, pair counters that cross a 2^32 boundary,
    one scale or one per element, fp32 or bf16 in/out) equals the scalar form
    (``_any_span``: one coin per element, ``u < t - floor(t)``) element by element."""
    import numpy as np

    key = (123456789, 987654321)
    f32 = np.float32
    for x in _span_inputs():
        xs = fast._np(x)
        n = xs.shape[0]
        scales = torch.logspace(-2, 2, n)
        enc = scales.numpy() if per_element else f32(1.7)
        dec = (1 / scales).numpy() if per_element else f32(0.6)
        for fmt in ("fp8_e4m3", "fp4_e2m1_tensor", "fp8_e5m2", "mxfp6_e2m3"):
            from snip.formats import get_spec

            el = get_spec(fmt).element
            elem = (el.mbits, el.emin, el.emax, f32(el.max_normal))
            for base in (0, 1, (1 << 33) - 151, (1 << 33) - 150, (5 << 40) + 3):
                for lo, hi in ((0, n), (1, n), (0, n - 1), (3, 4), (0, 1)):
                    got = np.zeros_like(xs)
                    e = enc[lo:hi] if per_element else enc
                    d = dec[lo:hi] if per_element else dec
                    fast._sr_span(xs[lo:hi], got[lo:hi], e, d, base, *elem, *key)
                    want = np.zeros_like(xs)
                    for j in range(lo, hi):
                        ej = enc[j:j + 1] if per_element else enc
                        dj = dec[j:j + 1] if per_element else dec
                        fast._any_span_vec(
                            xs[j:j + 1], want[j:j + 1],
                            np.full(1, ej, np.float32), np.full(1, dj, np.float32),
                            base + j - lo, 2, False, *elem, f32(el.step), f32(1 / el.step),
                            True, *key)
                    assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), (
                        fmt, base, lo, hi)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rounding", ["rne", "stochastic"])
def test_long_blocks_block_by_block(dtype, rounding, monkeypatch):
    """1x128 blocks are rounded block by block with scalar scales (a constant-size loop for whole
    rows, run-time with a short last block otherwise; several short rows a task, whose SR pair
    hashes are computed for all of the task's rows at once): same bits as the torch path on
    padded rows, NaN/inf blocks and all-zero blocks, odd rows, rows placed where their pair
    counters cross 2^32, and the same SR bits whatever the thread count."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(7, 300, generator=g) * torch.logspace(-5, 5, 300)
    x[1, 130] = float("nan")
    x[2, 5] = float("-inf")
    x[3, :128] = 0.0
    # (7, 300), (200, 64), (70, 192): rows shorter than half a task, several rows a task (the
    # last task short; 64- and 192-wide rows are the 1x128 blocks of a width-64 model)
    cases = [x, torch.randn(3, 1029, generator=g), torch.randn(5, 4096 * 3, generator=g),
             torch.randn(6, 128, 2, generator=g), torch.randn(200, 64, generator=g),
             torch.randn(70, 192, generator=g)]
    monkeypatch.setattr(fast, "_PARALLEL_MIN", 0)
    for case in cases:
        case = case.to(dtype)
        for preset in ("fp8_e4m3_tile128", "fp4_e2m1_tile128"):
            for axis in (-1, 1):
                a, b = both_paths(lambda c=case, p=preset, ax=axis: quantize(
                    c, p, axis=ax, rounding=rounding, generator=4), monkeypatch)
                monkeypatch.setattr(fast, "_PARALLEL_MIN", 0)
                torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    # rows placed in a larger tensor whose SR pair counters cross 2^32 inside one task of 64
    # rows (that task rounds span by span; the next ones take the rows' hashes at once with a
    # high word of 1)
    case = torch.randn(200, 64, generator=g).to(dtype)
    for preset in ("fp8_e4m3_tile128", "fp4_e2m1_tile128"):
        a, b = both_paths(lambda p=preset: quantize(
            case, p, axis=-1, rounding=rounding, generator=4,
            shard=RowShard(2**26 - 100, 2**26 + 200)), monkeypatch)
        monkeypatch.setattr(fast, "_PARALLEL_MIN", 0)
        assert torch.equal(a, b)
    before = torch.get_num_threads()
    try:
        for case in (cases[2], cases[4]):
            outs = []
            for threads in (1, 3):
                torch.set_num_threads(threads)
                outs.append(quantize(case.to(dtype), "fp8_e4m3_tile128", rounding=rounding,
                                     generator=8))
            assert torch.equal(outs[0], outs[1])
    finally:
        torch.set_num_threads(before)


def _absbits_max(a):
    """numpy's reference for ``fast._max_bits``: the largest ``|x|`` bit pattern as int32 (a
    bf16 element, held as uint16, as the fp32 pattern it stands for), 0 for no elements."""
    import numpy as np

    bits = (a.astype(np.int32) & 0x7FFF) << 16 if a.dtype == np.uint16 else a.view(np.int32)
    return int((bits & 0x7FFFFFFF).max(initial=0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_absbits_is_int32_bits(dtype):
    """``_absbits`` (the column kernels' per-element |x| bits) gives numpy's bits, NaN, inf,
    signed zeros and subnormals included, and is typed int32: numba widens ``int32 & int32``
    to int64, and an int64 there made the column kernels' one-thread builds compile their
    block-maximum loop 64 bits wide (RESULTS §7ai)."""
    import numba

    absbits = numba.njit(lambda a, i: fast._absbits(a, i))
    vals = [0.0, -0.0, 1.5, -3.25, 1e-40, -1e-45, 3e38, float("inf"), float("-inf"),
            float("nan"), -float("nan")]
    a = fast._np(torch.tensor(vals).to(dtype))
    for i in range(len(vals)):
        assert absbits(a, i) == _absbits_max(a[i:i + 1]), (dtype, vals[i])
    (sig,) = absbits.nopython_signatures
    assert sig.return_type == numba.int32


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_block_maxima_equal_numpy(dtype):
    """``_maxima`` (whole blocks of a multiple of 8 eight at a time by ``_block_maxima``'s
    shuffle reduction, other blocks and a short last block by ``_max_bits``) equals numpy's
    per-block maximum of the ``|x|`` bits for blocks of 4-128, 0-19 blocks (every remainder
    of a group of eight), a short last block or none, and unaligned starts; each block holds a
    NaN, an inf or a large negative value (in turn), at a place that moves from block to
    block."""
    import numba
    import numpy as np

    maxima = numba.njit(lambda a, lo, hi, m, k: fast._maxima(a[lo:hi], m, k))
    g = torch.Generator().manual_seed(5)
    x = fast._np(torch.randn(20 * 128 + 16, generator=g).to(dtype))
    specials = fast._np(torch.tensor([float("nan"), float("inf"), -1e30]).to(dtype))
    for k in (4, 8, 12, 16, 32, 128):
        for nblk in range(20):
            for short in (0, 3) if nblk else (0,):
                n = nblk * k - short
                for lo in (0, 3):
                    a = x[lo:lo + n].copy()
                    if nblk:
                        for b in range(nblk):
                            a[min(b * k + b % k, n - 1)] = specials[b % 3]
                    big = np.concatenate([x[:lo], a, x[lo + n:]])
                    m = np.full(nblk, -1, np.int32)
                    maxima(big, lo, lo + n, m, k)
                    want = [_absbits_max(a[b * k:(b + 1) * k]) for b in range(nblk)]
                    assert m.tolist() == want, (k, nblk, short, lo)


def test_exp2_int_exact_on_its_whole_range():
    """``_exp2_int(k)`` is fp32 ``2^k`` bit for bit for every k in [-149, 127] (subnormals
    included), called alone and inside a loop that LLVM vectorizes."""
    import numba
    import numpy as np

    ks = np.arange(-149, 128, dtype=np.int64)
    want = np.ldexp(np.float32(1.0), ks.astype(np.int32)).astype(np.float32)
    assert [fast._exp2_int(int(k)) for k in ks] == list(want)

    @numba.njit
    def loop(ks, out):
        for i in range(ks.shape[0]):
            out[i] = fast._exp2_int(ks[i])

    out = np.empty(ks.size, np.float32)
    loop(ks, out)
    assert np.array_equal(out.view(np.int32), want.view(np.int32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_max_bits_equals_numpy(dtype):
    """``_max_bits`` (LLVM vector IR: eight lanes, a horizontal maximum, a scalar tail) equals
    numpy's maximum of the ``|x|`` bits on every length 0-40 and 127-129, at every start offset
    0-8 (unaligned loads), wherever the largest element, a NaN, an inf or a -0 sits."""
    import numba
    import numpy as np

    max_bits = numba.njit(lambda a, lo, hi: fast._max_bits(a[lo:hi]))
    g = torch.Generator().manual_seed(3)
    x = fast._np(torch.randn(200, generator=g).to(dtype))
    for n in [*range(41), 127, 128, 129]:
        for lo in range(9):
            a = x[lo:lo + n].copy()
            for at in {0, n // 2, n - 1} if n else {None}:
                for special in (None, -1e30, float("inf"), float("nan"), -0.0):
                    b = a.copy()
                    if at is not None and special is not None:
                        b[at] = fast._np(torch.tensor([special]).to(dtype))[0]
                    big = np.concatenate([x[:lo], b, x[lo + n:]])
                    assert max_bits(big, lo, lo + n) == _absbits_max(b), (n, lo, at, special)


@pytest.mark.parametrize("k", [16, 32, 128])
def test_run_block_kernels_equal_scalar_rounding(k):
    """``_run`` (one task of ``_fused_rows``) on whole blocks of 16/32/128: the constant-size
    block loops (an odd block count, block hashes buffered, groups of blocks of 16), and
    the run-time loop they fall back to when the SR pair counters change their high word inside
    the run or the run is not whole blocks, equal scalar rounding element by element."""
    import numpy as np

    key = (55555, 7777777)
    f32 = np.float32
    g = torch.Generator().manual_seed(7)
    nblk = 5
    x = torch.randn(nblk * k, generator=g) * torch.logspace(-3, 3, nblk * k)
    x[k + 3] = float("nan")
    x[2 * k:3 * k] = 0.0
    for spec_name, sfmt, mul, t_dec in (("mxfp4", 1, f32(0), f32(0)),
                                        ("nvfp4", 3, f32(0.05), f32(0.3)),
                                        ("fp8_e4m3_tile128", 0, f32(0), f32(0))):
        el = get_spec(spec_name).element
        maxn = f32(el.max_normal)
        for xt in (x, x.bfloat16()):
            xs = fast._np(xt)
            for n in (nblk * k, nblk * k - 3):
                for sr in (False, True):
                    for base in (0, 6 * k, (1 << 33) - 2 * k, (3 << 40) + 2 * k):
                        got = np.zeros_like(xs[:n])
                        fast._run(xs[:n], got, k, nblk, base, sfmt, False,
                                  el.emax, maxn, mul, t_dec, False, el.mbits, el.emin, el.emax,
                                  maxn, f32(el.step), f32(1 / el.step), sr, *key)
                        m = np.array([_absbits_max(xs[b * k:min(n, (b + 1) * k)])
                                      for b in range(nblk)], np.int32)
                        enc = np.empty(nblk, np.float32)
                        dec = np.empty(nblk, np.float32)
                        fast._scales(m, enc, dec, sfmt, False, el.emax, maxn, mul, t_dec)
                        want = np.zeros_like(got)
                        for j in range(n):
                            b = j // k
                            fast._any_span_vec(
                                xs[j:j + 1], want[j:j + 1], enc[b:b + 1], dec[b:b + 1],
                                base + j, 2, False, el.mbits, el.emin, el.emax, maxn,
                                f32(el.step), f32(1 / el.step), sr, *key)
                        assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), (
                            spec_name, xt.dtype, n, sr, base)


@pytest.mark.parametrize("start", [0, 6, 7, (1 << 33) - 8, (1 << 33) + 2])
def test_column_blocks_sr_rows_in_pairs_equal_torch_path(start, monkeypatch):
    """Blocks along axis 0 with stochastic rounding round two rows per pair hash when the
    counters allow it: same bits as the torch path for an even and an odd shard start (odd:
    the row-by-row loop), a short odd last block (45 = 32 + 13 rows), more than one outer slice,
    and starts whose pair counters cross 2^32 inside a block (the guard falls back) or lie
    above it (a high word folded into the hash)."""
    from snip.formats.scaling import RowShard

    g = torch.Generator().manual_seed(11)
    cases = [torch.randn(45, 70, generator=g), torch.randn(64, 33, generator=g),
             torch.randn(45, 70, generator=g).bfloat16()]
    for x in cases:
        shard = RowShard(start, start + x.shape[0] + 64)
        for preset in ("mxfp4", "nvfp4", "fp8_e4m3_tile128"):
            a, b = both_paths(lambda x=x, p=preset, s=shard: quantize(
                x, p, axis=0, rounding="stochastic", generator=5, shard=s), monkeypatch)
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    x3 = torch.randn(3, 40, 24, generator=g)  # outer slices: blocks along the middle axis
    a, b = both_paths(lambda: quantize(x3, "mxfp4", axis=1, rounding="stochastic",
                                       generator=5), monkeypatch)
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_np_views_are_kept_by_address_size_and_dtype():
    """``_np`` keeps its views by (address, element count, dtype): a shorter tensor or another
    dtype at the same address gets its own view, each reading that tensor's bits."""
    t = torch.arange(8, dtype=torch.float32)
    v = fast._np(t)
    assert fast._np(t) is v and v.dtype == fast.np.float32 and v.tolist() == t.tolist()
    head = t[:3]
    assert head.data_ptr() == t.data_ptr() and fast._np(head).tolist() == [0.0, 1.0, 2.0]
    bits = fast._np(t, True)
    assert bits.dtype == fast.np.uint32 and bits.tolist() == t.view(torch.int32).tolist()
    halves = t[:4].view(torch.bfloat16)  # same address and element count as t, another dtype
    assert halves.numel() == t.numel() and fast._np(halves).dtype == fast.np.uint16
    assert fast._np(halves).tolist() == halves.view(torch.int16).to(torch.int32).bitwise_and(
        0xFFFF).tolist()
    fast._np(t)[1] = 7.0  # a view, not a copy
    assert t[1] == 7.0
