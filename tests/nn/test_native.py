"""gemm="native": FP8 GEMMs through torch._scaled_mm, checked against emulation on the CPU.

torch implements ``_scaled_mm`` on the CPU (slowly), so the wiring -- codes, scales, transposes,
seeds, what forward saves for backward -- is tested here at small sizes; the CUDA cases skip
without a GPU.
"""

import warnings

import pytest
import torch

from snip.errors import UserError
from snip.formats import Scaling, get_spec, quantize, replace_spec
from snip.nn import GemmConfig, GemmImpl, GemmSpecs, QLinear, convert, native_sqnr
from snip.nn import native as N
from snip.nn.gemm import quantized_linear
from snip.plan import PrecisionPlan

pytestmark = pytest.mark.skipif(not N.fp8_gemm_supported("cpu"),
                                reason="this torch has no CPU torch._scaled_mm")

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not (torch.cuda.is_available() and N.fp8_gemm_supported("cuda")),
    reason="no CUDA device with FP8 GEMMs"))]
NATIVE = ["fp8_e4m3", "fp8_e5m2", "fp8_e4m3_row"]
SR_GRADS = replace_spec("fp8_e4m3_row", name="row_sr", grad_rounding="stochastic")


def data(t=48, k=64, n=32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, k, generator=g) * torch.logspace(-2, 2, k)  # uneven columns
    w = torch.randn(n, k, generator=g) * 0.05
    dy = torch.randn(t, n, generator=g)
    return x.to(device), w.to(device), dy.to(device)


def run(impl, specs, x, w, dy, *, bias=None, save="hp", seed=3):
    xi, wi = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    bi = None if bias is None else bias.clone().requires_grad_(True)
    cfg = GemmConfig(specs=GemmSpecs.uniform(specs) if not isinstance(specs, GemmSpecs)
                     else specs, seed=seed, save=save, gemm=impl, strict=True)
    y = quantized_linear(xi, wi, bi, cfg)
    y.backward(dy)
    return y.detach(), xi.grad, wi.grad, None if bi is None else bi.grad


def calls(monkeypatch):
    seen = []
    real = torch._scaled_mm

    def spy(*a, **k):
        seen.append((a[0].dtype, tuple(a[0].shape), tuple(a[1].shape), k["scale_a"].shape))
        return real(*a, **k)

    monkeypatch.setattr(torch, "_scaled_mm", spy)
    return seen


@pytest.mark.parametrize("preset", NATIVE)
@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("rounding", ["rne", "stochastic"])
def test_fp8_operand_is_the_emulated_operand(preset, axis, rounding):
    """codes * scale == quantize(x) bit for bit (transposed for axis 0), RNE and SR, bf16 too."""
    x, _, _ = data()
    x[3, 5] = 0.0
    x[:, 7] = 0.0  # an all-zero column: scale falls back to 1
    spec = get_spec(preset)
    for inp in (x, x.bfloat16()):
        op = N.fp8_operand(inp, spec, axis, N.Rounding(rounding), 11)
        ref = quantize(inp.float(), spec, axis=axis, rounding=rounding, generator=11)
        ref = ref.t() if axis == 0 else ref
        assert op.codes.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
        assert op.codes.is_contiguous()
        assert torch.equal(op.dequantize(), ref)
        if spec.scaling is Scaling.CHANNEL:
            assert op.scale.shape == (ref.shape[0], 1)
        else:
            assert op.scale.numel() == 1


@pytest.mark.parametrize("preset", NATIVE)
@pytest.mark.parametrize("save", ["hp", "encoded"])
def test_native_runs_all_three_gemms_and_matches_emulation(preset, save, monkeypatch):
    x, w, dy = data()
    bias = torch.randn(w.shape[0])
    ref = run(GemmImpl.EMULATED, preset, x, w, dy, bias=bias, save=save)
    seen = calls(monkeypatch)
    got = run(GemmImpl.NATIVE, preset, x, w, dy, bias=bias, save=save)
    # fprop (T,K)x(K,N), dgrad (T,N)x(N,K), wgrad (N,T)x(T,K)
    shapes = sorted((a, b) for _, a, b, _ in seen)
    assert shapes == sorted([((48, 64), (64, 32)), ((48, 32), (32, 64)), ((32, 48), (48, 64))])
    for r, g, name in zip(ref, got, ("y", "dx", "dw", "db"), strict=True):
        # the operands are identical; only where the scales multiply in differs
        assert N.sqnr_db(r, g) > 60, name
    rowwise = get_spec(preset).scaling is Scaling.CHANNEL
    assert all((len(s) == 2) == rowwise for *_, s in seen)


def test_exact_where_the_math_says_so():
    """Operands whose codes and products are small integers times powers of two: every partial
    sum is exact in fp32, so native and emulated agree bit for bit (forward and backward)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randint(-8, 9, (32, 64), generator=g).float()
    w = torch.randint(-8, 9, (16, 64), generator=g).float()
    x[0, 0], w[0, 0] = 448.0, 448.0  # amax = 448: the fp32 scale is exactly 1
    dy = torch.randint(-4, 5, (32, 16), generator=g).float()
    dy[0, 0] = 448.0
    ref = run(GemmImpl.EMULATED, "fp8_e4m3", x, w, dy)
    got = run(GemmImpl.NATIVE, "fp8_e4m3", x, w, dy)
    for r, n in zip(ref[:3], got[:3], strict=True):
        assert torch.equal(r, n)


def test_sr_gradients_use_the_same_draws():
    """Stochastic gradient rounding: native and emulated quantize with the same seeds."""
    x, w, dy = data(seed=4)
    ref = run(GemmImpl.EMULATED, SR_GRADS, x, w, dy)
    got = run(GemmImpl.NATIVE, SR_GRADS, x, w, dy)
    other = run(GemmImpl.NATIVE, SR_GRADS, x, w, dy, seed=4)
    assert N.sqnr_db(ref[2], got[2]) > 60
    assert N.sqnr_db(ref[2], other[2]) < 60  # a different seed rounds differently


def test_mixed_specs_run_native_only_where_possible(monkeypatch):
    x, w, dy = data()
    specs = GemmSpecs(fprop="fp8_e4m3", dgrad="mxfp8_e4m3", wgrad="fp8_e4m3_row")
    seen = calls(monkeypatch)
    got = run(GemmImpl.NATIVE, specs, x, w, dy)
    ref = run(GemmImpl.EMULATED, specs, x, w, dy)
    assert len(seen) == 2  # fprop and wgrad; the mxfp8 dgrad is not a _scaled_mm GEMM
    assert N.sqnr_db(ref[1], got[1]) == float("inf")  # dgrad stayed emulated: identical
    assert N.sqnr_db(ref[0], got[0]) > 60


def test_non_fp8_specs_are_untouched(monkeypatch):
    x, w, dy = data()
    seen = calls(monkeypatch)
    for preset in ("mxfp4", "nvfp4", "fp8_e4m3_tile128", "bf16", "fp32"):
        ref = run(GemmImpl.EMULATED, preset, x, w, dy)
        got = run(GemmImpl.NATIVE, preset, x, w, dy)
        for r, g in zip(ref[:3], got[:3], strict=True):
            assert torch.equal(r, g)
    assert not seen


def test_qlinear_3d_input_autocast_and_repr():
    torch.manual_seed(0)
    lin = QLinear(64, 32, specs="fp8_e4m3_row")
    lin.set_gemm("native", strict=True)
    assert "gemm=native" in repr(lin)
    x = torch.randn(2, 24, 64, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = lin(x)
    assert y.dtype == torch.bfloat16 and y.shape == (2, 24, 32)
    y.float().sum().backward()
    assert x.grad.shape == x.shape and lin.weight.grad.shape == lin.weight.shape
    with pytest.raises(UserError, match="unknown gemm"):
        lin.set_gemm("fast")


def test_native_sqnr_helper():
    x, w, _ = data()
    out = native_sqnr(x, w, "fp8_e4m3")
    assert set(out) == {"fprop", "dgrad", "wgrad"} and min(out.values()) > 60
    assert native_sqnr(x, w, "mxfp4") == dict.fromkeys(("fprop", "dgrad", "wgrad"), float("inf"))


def test_no_fp8_hardware_warns_once_or_raises_when_strict(monkeypatch):
    monkeypatch.setattr(N, "fp8_gemm_supported", lambda device: False)
    monkeypatch.setattr(N, "_warned", set())
    x, w, dy = data()
    with pytest.raises(UserError, match="needs FP8 GEMM hardware"):
        run(GemmImpl.NATIVE, "fp8_e4m3", x, w, dy)  # run() passes strict=True
    lin = QLinear(64, 32, specs="fp8_e4m3")
    lin.set_gemm("native")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y1 = lin(x)
        lin.step = 0
        y2 = lin(x)
    assert len([c for c in caught if "needs FP8 GEMM hardware" in str(c.message)]) == 1
    lin.set_gemm("emulated")
    lin.step = 0
    assert torch.equal(y1, lin(x)) and torch.equal(y1, y2)


def test_cuda_shape_rules_fall_back():
    a = N.Fp8Operand(torch.zeros(48, 40, dtype=torch.float8_e4m3fn), torch.ones(()))
    b = N.Fp8Operand(torch.zeros(32, 40, dtype=torch.float8_e4m3fn), torch.ones(()))
    assert N.shapes_ok(a, b)  # the CPU has no layout rules


def test_plan_gemm_key_round_trip_and_convert(tmp_path):
    plan = PrecisionPlan.uniform("fp8_e4m3_row")
    assert "gemm" not in plan.to_dict()  # emulated plans are written as before
    native = PrecisionPlan.from_dict({**plan.to_dict(), "gemm": "native"})
    assert native.gemm is GemmImpl.NATIVE
    native.to_json(tmp_path / "p.json")
    again = PrecisionPlan.from_json(tmp_path / "p.json")
    assert again.gemm is GemmImpl.NATIVE and again.to_dict()["gemm"] == "native"
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    convert(model, again)
    assert all(m.gemm is GemmImpl.NATIVE for m in model if isinstance(m, QLinear))
    with pytest.raises(UserError, match="plan gemm"):
        PrecisionPlan.from_dict({**plan.to_dict(), "gemm": "tensorcores"})
    with pytest.raises(UserError, match="plan gemm"):
        PrecisionPlan.from_dict({**plan.to_dict(), "gemm": 1})


@pytest.mark.parametrize("device", DEVICES)
def test_native_close_to_emulated_on_device(device):
    x, w, dy = data(t=64, k=128, n=64, device=device)
    for preset in NATIVE[:1] + NATIVE[2:]:  # e5m2 x e5m2 has no cuBLAS kernel
        ref = run(GemmImpl.EMULATED, preset, x, w, dy)
        got = run(GemmImpl.NATIVE, preset, x, w, dy)
        for r, g in zip(ref[:3], got[:3], strict=True):
            assert N.sqnr_db(r, g) > 40  # bf16 output for rowwise on CUDA


@pytest.mark.parametrize(("preset", "quantizations", "saved"), [
    ("fp8_e4m3", 3, 48 * 64 + 4),   # tensor scale, RNE: X, W, dY once each; X saved as codes
    ("fp8_e4m3_row", 6, 48 * 64 * 4),  # one scale per row: every operand per GEMM; X kept fp32
])
def test_axis_free_codes_are_quantized_once(preset, quantizations, saved, monkeypatch):
    import snip.nn.gemm as G

    x, w, dy = data()
    ref = run(GemmImpl.EMULATED, preset, x, w, dy)
    n = []
    real = G.fp8_operand
    monkeypatch.setattr(G, "fp8_operand", lambda *a: n.append(1) or real(*a))
    lin = QLinear(64, 32, bias=False, specs=preset, seed=3)
    lin.set_gemm("native", strict=True)
    with torch.no_grad():
        lin.weight.copy_(w)
    xi = x.clone().requires_grad_(True)
    y = lin(xi)
    assert lin.saved_bytes == saved
    y.backward(dy)
    assert len(n) == quantizations
    for r, g in zip(ref[:3], (y.detach(), xi.grad, lin.weight.grad), strict=True):
        assert N.sqnr_db(r, g) > 60


def test_compiled_quantizer_is_opt_in_and_cuda_only(monkeypatch):
    monkeypatch.setenv("SNIP_FP8_COMPILE", "1")
    assert N.compiled_quantizer(torch.device("cpu")) is None
    monkeypatch.setenv("SNIP_FP8_COMPILE", "0")
    assert N.compiled_quantizer(torch.device("cuda")) is None


@pytest.mark.parametrize("preset", ["fp8_e4m3", "fp8_e4m3_row"])
@pytest.mark.parametrize("save", ["hp", "encoded"])
def test_shapes_cublas_refuses_run_emulated(preset, save, monkeypatch):
    """A GEMM whose shapes break cuBLASLt's rules (dims not multiples of 16) runs emulated --
    also when forward already saved FP8 codes for it."""
    import snip.nn.gemm as G

    x, w, dy = data()
    ref = run(GemmImpl.EMULATED, preset, x, w, dy, save=save)
    seen = calls(monkeypatch)
    monkeypatch.setattr(G, "shapes_ok", lambda a, b: False)
    got = run(GemmImpl.NATIVE, preset, x, w, dy, save=save)
    assert not seen
    for r, g in zip(ref[:3], got[:3], strict=True):
        assert torch.equal(r, g)
    # only the backward GEMMs refused: forward native, backward emulated from saved codes
    monkeypatch.setattr(G, "shapes_ok", lambda a, b: a.codes.shape[1] == x.shape[1])
    got = run(GemmImpl.NATIVE, preset, x, w, dy, save=save)
    assert len(seen) == 1
    for r, g in zip(ref[:3], got[:3], strict=True):
        assert N.sqnr_db(r, g) > 60


@pytest.mark.parametrize("preset", ["fp8_e4m3", "fp8_e4m3_row"])
def test_bf16_layer_native_close_to_emulated(preset):
    """bf16 X, W and dY (dY reaches the FP8 quantizer without an fp32 copy; that this gives the
    fp32 bits is test_fp8_operand_is_the_emulated_operand's bf16 case)."""
    x, w, dy = data()
    out = {}
    for impl in GemmImpl:
        xi, wi = x.bfloat16().requires_grad_(True), w.bfloat16().requires_grad_(True)
        cfg = GemmConfig(specs=GemmSpecs.uniform(preset), gemm=impl, strict=True)
        y = quantized_linear(xi, wi, None, cfg)
        assert y.dtype == torch.bfloat16
        y.backward(dy.bfloat16())
        out[impl] = (y.detach(), xi.grad, wi.grad)
    for a, b in zip(out[GemmImpl.EMULATED], out[GemmImpl.NATIVE], strict=True):
        assert b.dtype == torch.bfloat16 and N.sqnr_db(a.float(), b.float()) > 40
