"""The per-call shortcuts of the fused path (issue 21) equal the PyTorch path bit for bit: the
one-pass bf16 cast, and the tensor scales computed on numpy fp32 scalars instead of 1x1 tensors;
and the per-call memos (numba's thread count, spec hashes, weight-tile specs) keep their
meaning."""

import random

import numpy as np
import pytest
import torch

from snip.formats import Rounding, cast, fast, get_spec, quantize
from snip.formats.scaling import fp32_scales, nvfp4_encode_scale

pytestmark = pytest.mark.skipif("not fast.enabled()",
                                reason="fast path off (numba not installed or SNIP_FAST=0)")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


def _edge_values() -> torch.Tensor:
    """Every fp32 binade, ties, the bf16 saturation boundary, subnormals, inf, NaN."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 77, generator=g) * torch.logspace(-45, 38.5, 77)
    x[1] = (torch.randint(-2**16, 2**16, (77,), generator=g) + 0.5) * 2.0**-16  # bf16 ties
    row = [float("inf"), -float("inf"), 3.3895313e38, 3.3895314e38, 3.4028235e38, -3.39e38,
           1e-45, -1e-40, 0.0, -0.0]
    x[0, :len(row)] = torch.tensor(row)
    return x


@pytest.mark.parametrize("n", [1, 77, 300 * 77, 1 << 21])  # tails, one chunk, many chunks
def test_round_bf16_equals_torch_cast(n):
    x = _edge_values().reshape(-1)
    x = x.repeat(-(-n // x.numel()))[:n].contiguous()
    got, want = fast.round_bf16(x), cast(x, "bf16")
    assert torch.equal(_bits(got), _bits(want))  # no NaN in x: every bit pattern must match


def test_round_bf16_nan_stays_nan_and_quantize_uses_it(monkeypatch):
    x = _edge_values()
    x[2, 3] = float("nan")
    got = quantize(x, "bf16")
    monkeypatch.setattr(fast, "enabled", lambda: False)
    want = quantize(x, "bf16")
    # NaN payloads differ between torch's own vector and scalar conversions; values must not
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(_bits(got[~nan]), _bits(want[~nan]))


AMAXES = [0.0, 1e-45, 1e-40, 1.1754942e-38, 1e-30, 0.5, 1.0, 3.0, 448.0, 1e30, 3.4028235e38,
          float("inf"), float("nan"),
          *np.random.default_rng(0).lognormal(0, 25, 500).astype(np.float32).tolist()]


def _same(a: float, b: float) -> bool:
    a32, b32 = np.float32(a), np.float32(b)
    return bool(np.isnan(a32) and np.isnan(b32)) or a32.view(np.int32) == b32.view(np.int32)


@pytest.mark.parametrize("preset", ["fp8_e4m3", "fp4_e2m1_tensor"])
def test_tensor_scale_scalars_equal_fp32_scales(preset):
    spec = get_spec(preset)
    maxn = np.float32(spec.element.max_normal)
    for amax in AMAXES:
        ref = fp32_scales(torch.tensor([[amax]], dtype=torch.float32), spec)
        enc, dec = fast._tensor_scale(np.float32(amax), maxn)
        assert _same(enc, ref.encode.item()) and _same(dec, ref.decode.item()), amax


def test_nvfp4_tensor_scale_scalars_equal_the_tensor_chain():
    spec = get_spec("nvfp4")
    inv_elem = torch.tensor(1.0 / spec.element.max_normal, dtype=torch.float32)
    for amax in AMAXES:
        s_enc = nvfp4_encode_scale(torch.tensor(amax, dtype=torch.float32), spec)
        mul, t_dec = fast._nvfp4_tensor_scale(np.float32(amax),
                                              np.float32(spec.element.max_normal))
        assert _same(mul, (s_enc * inv_elem).item()) and _same(t_dec, (1.0 / s_enc).item()), amax


def test_thread_count_memo_follows_torch_and_size_in_every_thread(monkeypatch):
    """numba's count is per thread and each thread remembers what it set: the memo must still
    give a large tensor torch's count and a small one a single thread, in any thread."""
    import threading

    import numba

    x_small, x_large = torch.randn(8, 32), torch.randn(8, 32)
    before = torch.get_num_threads()
    seen = {}

    def run(tag):
        monkeypatch.setattr(fast, "_PARALLEL_MIN", 1 << 20)
        quantize(x_small, "mxfp4")
        seen[tag, "small"] = numba.get_num_threads()
        monkeypatch.setattr(fast, "_PARALLEL_MIN", 0)  # x_large now counts as large
        quantize(x_large, "mxfp4")
        seen[tag, "large"] = numba.get_num_threads()

    try:
        torch.set_num_threads(2)
        run("main")
        worker = threading.Thread(target=run, args=("worker",))
        worker.start()
        worker.join()
    finally:
        torch.set_num_threads(before)
    want = max(1, min(2, numba.config.NUMBA_NUM_THREADS))
    for tag in ("main", "worker"):
        assert seen[tag, "small"] == 1 and seen[tag, "large"] == want


def test_spec_hash_agrees_with_equality_and_weight_tiles_are_made_once():
    from snip.formats import replace_spec

    for name in ("mxfp4", "nvfp4", "fp8_e4m3_tile128", "bf16", "int8"):
        spec = get_spec(name)
        twin = replace_spec(spec)  # equal, another object
        assert twin == spec and twin is not spec and hash(twin) == hash(spec)
        assert hash(twin.element) == hash(spec.element)
        assert {spec: 1}[twin] == 1
        w = spec.for_weight()
        assert w is spec.for_weight() and w == twin.for_weight()  # one tiled spec per spec
        assert (w.scaling is fast.Scaling.BLOCK2D) == spec.weight_2d and not w.weight_2d
    assert replace_spec("mxfp4", block=16) != get_spec("mxfp4")  # same name, not equal


def _same_bf16(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal bf16 bit patterns, NaN wherever the other is NaN (payloads are not the contract)."""
    assert got.dtype == want.dtype == torch.bfloat16
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))


@pytest.mark.parametrize("n", [77, 300 * 77, 1 << 21])
def test_round_bf16_into_bf16_is_the_fp32_result_cast(n):
    x = _edge_values().reshape(-1)
    x[5] = float("nan")
    x = x.repeat(-(-n // x.numel()))[:n].contiguous()
    _same_bf16(fast.round_bf16(x, torch.bfloat16), fast.round_bf16(x).bfloat16())


# every kind of fused kernel: row blocks of 16/32 (compile-time sizes) and others, column
# blocks, 2-D tiles, one tensor scale, NVFP4's two-level scales
@pytest.mark.parametrize("preset", ["mxfp4", "mxfp8_e4m3", "nvfp4", "fp4_e2m1_tile128",
                                    "fp8_e4m3", "fp8_e4m3_tile128", "fp4_e2m1_tensor", "int4_g32",
                                    "fp8_e4m3_row", "mxfp8_e4m3_rceil"])
@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("rounding", ["rne", "stochastic"])
def test_quantize_into_bf16_is_the_fp32_result_cast(preset, axis, rounding):
    """``quantize(x, dtype=bf16)`` stores in the kernel's own pass what casting the fp32 result
    gives: the same fp32 values, rounded to bf16 by the same rule as torch's cast."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(96, 160, generator=g) * torch.logspace(-30, 30, 160)
    x[3, 7], x[50, 0] = float("nan"), float("inf")
    spec = get_spec(preset)
    specs = [spec] + ([spec.for_weight()] if spec.weight_2d and rounding == "rne" else [])
    for s in specs:  # activations' 1-D blocks, and weights' 2-D tiles (fused for RNE)
        kw = {"axis": axis, "rounding": rounding, "generator": 9}
        _same_bf16(quantize(x, s, dtype=torch.bfloat16, **kw), quantize(x, s, **kw).bfloat16())


def test_seed_key_is_the_key_a_fresh_generator_draws_and_leaves_the_global_rng() -> None:
    from snip.formats.cast import draw_key, make_generator, seed_key

    state = torch.get_rng_state()
    for seed in (0, 1, 12345, 2**62 + 7):
        assert seed_key(seed) == draw_key(make_generator(seed, torch.device("cpu")))
    assert torch.equal(torch.get_rng_state(), state)


def test_fast_seed_key_is_torchs_generator_key() -> None:
    """``fast.seed_key`` (MT19937 in numba, no generator) is the key torch's CPU generator
    draws, for seeds over the whole range the layers use (63-bit), both 32-bit halves' edges
    and negative ones; and the fused kernels get that key from an int seed."""
    from snip.formats.cast import seed_key as torch_seed_key

    rng = random.Random(0)
    seeds = [0, 1, 5, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 1, 2**62 + 7, 2**63 - 1,
             -1, -(2**40) - 3] + [rng.getrandbits(63) for _ in range(500)]
    assert [fast.seed_key(s) for s in seeds] == [torch_seed_key(s) for s in seeds]
    x = torch.randn(64, 96)
    spec = get_spec("mxfp4")
    by_seed = fast.quantize_fused(x, spec, -1, Rounding.STOCHASTIC, 77)
    by_generator = fast.quantize_fused(x, spec, -1, Rounding.STOCHASTIC,
                                       torch.Generator().manual_seed(77))
    assert torch.equal(by_seed, by_generator)


@pytest.mark.parametrize("preset", ["mxfp4", "nvfp4", "fp8_e4m3"])
def test_plans_are_per_shape_axis_and_rounding(preset, monkeypatch) -> None:
    """The per-call plan cache (one kernel call worked out per spec, shape, axis, rounding)
    never hands one call's arguments to another: interleaved calls equal the PyTorch path."""
    g = torch.Generator().manual_seed(5)
    xs = [torch.randn(64, 96, generator=g), torch.randn(96, 64, generator=g),
          torch.randn(32, 96, generator=g)]
    for _ in range(2):
        for x in xs:
            for axis in (-1, 0):
                for rounding in ("rne", "stochastic"):
                    got = quantize(x, preset, axis=axis, rounding=rounding, generator=3)
                    with monkeypatch.context() as m:
                        m.setattr(fast, "enabled", lambda: False)
                        want = quantize(x, preset, axis=axis, rounding=rounding, generator=3)
                    assert torch.equal(got, want), (x.shape, axis, rounding)


@pytest.mark.parametrize("preset", ["fp8_e4m3", "nvfp4", "mxfp4"])
def test_quantize_into_a_wider_dtype_rounds_in_the_input_dtype_first(preset) -> None:
    """``dtype`` wider than the input's (bf16 in, fp32 out) gives the input-dtype result
    converted, as the docstring says, not the fp32 result the kernel computes inside."""
    x = torch.randn(64, 96, generator=torch.Generator().manual_seed(6)).bfloat16()
    want = quantize(x, preset).float()
    assert torch.equal(quantize(x, preset, dtype=torch.float32), want)


def test_thread_choice_tries_both_keeps_all_threads_unless_slower_or_waited() -> None:
    """Middle-size calls warm both ways up (untimed), then alternate one thread and all threads
    for a few timed calls, keep all threads unless their median call took over TIE x the
    median one-thread call or one of them waited for a thread (over STALL x their median and
    STALL_S above it), and re-try every EVERY calls."""
    c = fast._ThreadChoice()
    p, every, warm = c.PROBES, c.EVERY, c.WARM
    assert c.TIE > 1 and c.STALL > 1 and c.STALL_S > 0

    def play(times, calls: int) -> list[bool]:
        """``times(parallel, i)``: the i-th call's seconds."""
        picks = []
        for i in range(calls):
            par = c.pick()
            picks.append(par)
            c.record(par, times(par, i))
        return picks

    def probed(picks: list[bool]) -> bool:
        assert picks[:2 * p] == [False, True] * p  # the probes alternate, one thread first
        assert len(set(picks[2 * p:])) == 1  # then one choice until the next probes
        return picks[2 * p]

    ms = 1e-3
    # the warm-up pair is slow both ways and does not count; then all threads win
    first = play(lambda par, i: 50.0 if i < warm else (1.0 if par else 2.0) * ms, warm + every)
    assert first[:warm] == [False, True] and probed(first[warm:])
    # slower, but within the tie: all threads (they save the other threads' wake-ups)
    assert probed(play(lambda par, i: (1.2 if par else 1.0) * ms, every))
    assert not probed(play(lambda par, i: (1.3 if par else 1.0) * ms, every))  # beyond it
    # one lucky one-thread call (0.5) does not decide it: the median one-thread call does
    assert probed(play(lambda par, i: (1.0 if par else (0.5 if i == 2 else 0.9)) * ms, every))
    # nor does one lucky parallel call (0.9): the median parallel call (1.5) is over the tie
    assert not probed(play(lambda par, i: ((0.9 if i == 1 else 1.5) if par else 1.0) * ms,
                           every))
    # one parallel call of the probes waited for a thread (a scheduler tick): one thread
    waited = play(lambda par, i: ((9.0 if i == 2 * p - 1 else 0.5) if par else 1.0) * ms, every)
    assert not probed(waited)
    # a slow parallel call that is no such wait (3x the median but 0.2 ms above it) is kept
    assert probed(play(lambda par, i: ((0.3 if i == 2 * p - 1 else 0.1) if par else 0.2) * ms,
                       every))
    # nor is a long call 0.8 ms above its median but under twice it (2.8 against 2.0 ms)
    assert probed(play(lambda par, i: ((2.8 if i == 2 * p - 1 else 2.0) if par else 2.0) * ms,
                       every))
    # three of four parallel calls waited alike: their median is over the tie
    assert not probed(play(lambda par, i: ((0.5 if i == 1 else 9.0) if par else 1.0) * ms,
                           every))


def test_round_bf16_chooses_its_threads_per_size(monkeypatch) -> None:
    """The bf16 rounding of a middle-size tensor tries one thread and all threads too (it ran on
    one thread below 2^20 elements, the slowest call of a 2-thread bf16 step); small calls stay
    on one thread."""
    seen: list[bool | None] = []
    real = fast._follow_torch_threads
    monkeypatch.setattr(fast, "_follow_torch_threads",
                        lambda n=None, parallel=None: (seen.append(parallel), real(n, parallel)))
    monkeypatch.setattr(fast, "_BF16_CHOICES", {})
    x = torch.randn(256, 128, generator=torch.Generator().manual_seed(9))  # 2^15 elements
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        outs = [fast.round_bf16(x) for _ in range(fast._ThreadChoice.WARM + 2)]
        fast.round_bf16(x[:8])
    finally:
        torch.set_num_threads(threads)
    assert seen == [False, True, False, True, False]
    assert all(torch.equal(o, x.bfloat16().float()) for o in outs)


def test_thread_count_does_not_change_bits(monkeypatch) -> None:
    """Whatever the choice, the bits are the same (the kernels' contract)."""
    x = torch.randn(256, 128, generator=torch.Generator().manual_seed(8))
    outs = []
    threads = torch.get_num_threads()
    for parallel in (False, True):
        monkeypatch.setattr(fast._ThreadChoice, "pick", lambda self, p=parallel: p)
        monkeypatch.setattr(fast, "_PLANS", {})
        torch.set_num_threads(2)
        try:
            outs.append(quantize(x, "mxfp4", rounding="stochastic", generator=2))
        finally:
            torch.set_num_threads(threads)
    assert torch.equal(*outs)
