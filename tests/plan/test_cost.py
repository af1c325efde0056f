"""Cost model: FLOPs by hand, FP4-FLOP fraction, relative time per profile, memory, 70B speed.

Tolerances: every ``approx`` here compares float64 arithmetic on the same numbers summed in
another order (an ILP's objective against brute force's, a fraction of integer FLOPs, a JSON
round trip); Python floats round the same on every CPU, so ``rel=1e-9`` (or approx's default
1e-6) is millions of times wider than the ~n x 2^-53 such a sum can differ by."""

from __future__ import annotations

import json
import time

import pytest
import torch
from torch import nn

from snip.nn.specs import Gemm, GemmSpecs
from snip.plan import (
    PROFILES,
    PrecisionPlan,
    ThroughputProfile,
    fp4_flop_fraction,
    gemm_flops,
    get_profile,
    layer_flops,
    linear_layers,
    memory,
    relative_gemm_time,
    total_flops,
)

FP4, FP8, BF16 = "fp4_e2m1_tile128", "fp8_e4m3_tile128", "bf16"
DIM, KV, FFN = 16, 8, 32
BLOCK_KN = 2 * DIM * DIM + 2 * DIM * KV + 3 * DIM * FFN  # 2304: sum of K*N over one block


def llama_stack(n_layers: int = 2, dim: int = DIM, kv: int = KV, ffn: int = FFN,
                vocab: int = 40, device: str | None = None) -> nn.Module:
    """Module tree named like snip.models' Llama: layers.<i>.attention.wq ..., output."""
    with torch.device(device or "cpu"):
        def lin(i: int, o: int) -> nn.Linear:
            return nn.Linear(i, o, bias=False)

        def block() -> nn.Module:
            attn = nn.ModuleDict({"wq": lin(dim, dim), "wk": lin(dim, kv), "wv": lin(dim, kv),
                                  "wo": lin(dim, dim)})
            ff = nn.ModuleDict({"w1": lin(dim, ffn), "w2": lin(ffn, dim), "w3": lin(dim, ffn)})
            return nn.ModuleDict({"attention": attn, "feed_forward": ff})
        return nn.ModuleDict({"layers": nn.ModuleList(block() for _ in range(n_layers)),
                              "output": lin(dim, vocab)})


def uniform(name: str) -> dict[str, str]:
    return dict.fromkeys(("fprop", "dgrad", "wgrad"), name)


@pytest.fixture
def model() -> nn.Module:
    return llama_stack(device="meta")


@pytest.fixture
def half_fp4() -> PrecisionPlan:
    """Block 0 in FP4, block 1 in FP8: half of the linear FLOPs in FP4."""
    return PrecisionPlan(default=uniform(FP8), layers={r"re:layers\.0\..*": uniform(FP4)})


# --------------------------------------------------------------------------------------------
# FLOPs
# --------------------------------------------------------------------------------------------

def test_flops_by_hand(model):
    flops = gemm_flops(model, tokens=8)
    assert list(flops) == list(linear_layers(model))  # head excluded by default
    assert flops["layers.0.attention.wk"] == dict.fromkeys(Gemm, 2 * 8 * DIM * KV)
    assert flops["layers.1.feed_forward.w2"][Gemm.WGRAD] == 2 * 8 * FFN * DIM
    assert layer_flops(model, 8)["layers.0.attention.wq"] == 3 * 2 * 8 * DIM * DIM
    assert total_flops(model, 8) == 6 * 8 * 2 * BLOCK_KN == 221184
    assert total_flops(model, 8, names=["output"]) == 6 * 8 * DIM * 40


def test_flops_need_positive_int_tokens(model):
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="tokens must be a positive int"):
            total_flops(model, bad)


def test_unknown_layer_in_table_is_an_error(model):
    with pytest.raises(ValueError, match="'layers.9.attention.wq' is not a linear layer"):
        fp4_flop_fraction({"layers.9.attention.wq": GemmSpecs.uniform(FP4)}, model)


# --------------------------------------------------------------------------------------------
# FP4-FLOP fraction
# --------------------------------------------------------------------------------------------

def test_fp4_fraction_half_the_layers(model, half_fp4):
    assert fp4_flop_fraction(half_fp4, model, tokens=128) == pytest.approx(0.5)
    assert fp4_flop_fraction(half_fp4.resolve(model), model) == pytest.approx(0.5)


def test_fp4_fraction_by_layer_type_and_by_gemm(model):
    ffn_fp4 = PrecisionPlan(default=uniform(FP8), layers={r"re:.*feed_forward.*": uniform("nvfp4")})
    assert fp4_flop_fraction(ffn_fp4, model) == pytest.approx(3 * DIM * FFN / BLOCK_KN)
    fprop_only = PrecisionPlan(default={**uniform(FP8), "fprop": FP4})
    assert fp4_flop_fraction(fprop_only, model) == pytest.approx(1 / 3)
    assert fp4_flop_fraction(PrecisionPlan.uniform("mxfp4"), model) == 1.0
    assert fp4_flop_fraction(PrecisionPlan.uniform(BF16), model) == 0.0


# --------------------------------------------------------------------------------------------
# Relative GEMM time and profiles
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("profile, expected", [
    ("hopper", 0.5 / 2 + 0.5 / 2),        # FP4 runs at the FP8 rate
    ("blackwell", 0.5 / 4 + 0.5 / 2),
    ("blackwell_ultra", 0.5 / 6 + 0.5 / 2),
    ("uniform", 1.0),
])
def test_relative_time_per_profile(model, half_fp4, profile, expected):
    assert relative_gemm_time(half_fp4, model, 64, profile) == pytest.approx(expected)
    assert relative_gemm_time(PrecisionPlan.uniform(BF16), model, 64, profile) == 1.0


def test_relative_time_fp32_and_custom_profile(model):
    assert relative_gemm_time(PrecisionPlan.uniform("fp32"), model, 1, "hopper") == 2.0
    custom = {"name": "toy", "relative_speed": {"4": 3.0, "8": 1.5, "nvfp4": 5.0}, "source": "x"}
    plan = PrecisionPlan(default=uniform(FP4), layers={r"re:layers\.1\..*": uniform("nvfp4")})
    assert relative_gemm_time(plan, model, 1, custom) == pytest.approx(0.5 / 3 + 0.5 / 5)


def test_profile_lookup_order_and_named_profiles():
    p = ThroughputProfile(name="t", relative_speed={4: 4.0, "int4": 2.0, "mxfp4": 3.0})
    assert p.speed("nvfp4") == 4.0     # by bits
    assert p.speed("int4_g32") == 2.0  # by element name
    assert p.speed("mxfp4") == 3.0     # by preset name
    assert p.speed("bf16") == 1.0      # 16 bits is the unit, filled in
    assert set(PROFILES) == {"hopper", "blackwell", "blackwell_ultra", "uniform"}
    assert PROFILES["blackwell"].speed("nvfp4") == 4 and PROFILES["hopper"].speed("nvfp4") == 2
    assert PROFILES["blackwell_ultra"].speed("mxfp4") == 6
    assert "2509.25149" in PROFILES["blackwell"].source and "H100" in PROFILES["hopper"].source
    assert get_profile("Blackwell") is PROFILES["blackwell"]


def test_profile_from_json_file(tmp_path):
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(PROFILES["blackwell_ultra"].to_dict()))
    assert get_profile(path) == PROFILES["blackwell_ultra"]
    assert get_profile(str(path)) == PROFILES["blackwell_ultra"]
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x",\n "relative_speed": {4: 2}}')
    with pytest.raises(ValueError, match=r"bad\.json is not valid JSON: line 2"):
        get_profile(bad)
    with pytest.raises(FileNotFoundError, match="missing.json"):
        get_profile(tmp_path / "missing.json")


def test_profile_errors():
    with pytest.raises(ValueError, match="unknown throughput profile 'ampere'.*hopper"):
        get_profile("ampere")
    with pytest.raises(ValueError, match="positive number"):
        ThroughputProfile(name="x", relative_speed={4: 0})
    with pytest.raises(ValueError, match="relative to bf16"):
        ThroughputProfile(name="x", relative_speed={16: 2.0})
    with pytest.raises(ValueError, match="no speed for 'fp8_e4m3'.*'e4m3' or 8"):
        ThroughputProfile(name="x", relative_speed={4: 2.0}).speed("fp8_e4m3")
    with pytest.raises(ValueError, match="relative_speed"):
        ThroughputProfile.from_dict({"name": "x"})


# --------------------------------------------------------------------------------------------
# Memory
# --------------------------------------------------------------------------------------------

def test_memory_by_hand(model):
    plan = PrecisionPlan(default=uniform(BF16), layers={
        "layers.0.attention.wq": {"fprop": "nvfp4", "dgrad": "nvfp4", "wgrad": "mxfp8_e4m3"}})
    est = memory(plan, model, tokens=8)
    rows = {m.name: m for m in est.layers}
    wq = rows["layers.0.attention.wq"]
    # nvfp4 weights use 16x16 e4m3 blocks: 4 + 8/256 bits; mxfp8 activations 8 + 8/32 bits.
    assert wq.weight_bytes == DIM * DIM * (4 + 8 / 256) / 8 == 129
    assert wq.activation_bytes == 8 * DIM * 8.25 / 8 == 132
    wk = rows["layers.0.attention.wk"]
    assert (wk.weight_bytes, wk.activation_bytes) == (DIM * KV * 2, 8 * DIM * 2)
    n_bf16_weights = 2 * BLOCK_KN - DIM * DIM
    assert est.weight_bytes == 129 + 2 * n_bf16_weights
    by_fmt = est.by_format()
    assert by_fmt["weights"] == {"nvfp4": 129, "bf16": 2 * n_bf16_weights}
    assert by_fmt["activations"]["mxfp8_e4m3"] == 132
    assert est.total_bytes == est.weight_bytes + est.activation_bytes


def test_memory_fp4_tile128_weights(model):
    est = memory(PrecisionPlan.uniform(FP4), model, tokens=4)
    wq = est.layers[0]
    assert wq.weight_bytes == pytest.approx(DIM * DIM * (4 + 32 / 128**2) / 8)
    assert wq.activation_bytes == pytest.approx(4 * DIM * (4 + 32 / 128) / 8)


# --------------------------------------------------------------------------------------------
# Llama-2-70B shapes on the meta device
# --------------------------------------------------------------------------------------------

LLAMA2_70B_LINEAR_PARAMS = 80 * (2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672)


def _check_70b(model: nn.Module) -> None:
    plan = PrecisionPlan(default=uniform(FP8), layers={  # first and last block first: they win
        r"re:layers\.(0|79)\..*": uniform(BF16),
        r"re:layers\.[0-9]+\.feed_forward\.w[13]": uniform(FP4)})
    start = time.perf_counter()
    flops = total_flops(model, tokens=1)
    frac = fp4_flop_fraction(plan, model)
    rel = relative_gemm_time(plan, model, 4096, "blackwell")
    mem = memory(plan, model, tokens=4096)
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, f"70B cost model took {elapsed:.2f}s"
    assert flops == 6 * LLAMA2_70B_LINEAR_PARAMS  # ~410.7 GFLOP per token
    ffn13 = 2 * 8192 * 28672
    assert frac == pytest.approx(78 * ffn13 / LLAMA2_70B_LINEAR_PARAMS)
    assert 0.25 < rel < 0.5 and mem.weight_bytes > 0


def test_llama2_70b_meta_stack_costs_in_under_a_second():
    start = time.perf_counter()
    model = llama_stack(n_layers=80, dim=8192, kv=1024, ffn=28672, vocab=32000, device="meta")
    assert time.perf_counter() - start < 5.0
    assert all(p.is_meta for p in model.parameters())
    _check_70b(model)


def test_llama2_70b_from_snip_models():
    from snip.models import build_model

    _check_70b(build_model("llama2-70b", device="meta"))
