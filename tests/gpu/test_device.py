"""Every format and QLinear on every device: emulation on CUDA equals CPU bit for bit.

The numba kernels are CPU-only; elsewhere the PyTorch path runs.  These tests run the PyTorch
path on each device (the CUDA cases skip without a GPU) against the CPU result, which itself is
pinned to the fused kernels (``test_fast.py``) -- so CUDA == CPU torch path == CPU fused path.
"""

import pytest
import torch

from snip.formats import PRESETS, cast, encode, fast, quantize
from snip.formats.cast import counter_uniforms, draw_key, make_generator, uniform_like
from snip.formats.hadamard import irht, rht, rht_matrix
from snip.nn import GemmSpecs, QLinear

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device"))]
ALL = [n for n in PRESETS if n != "fp32"]


def inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 96, generator=g) * torch.logspace(-6, 6, 96)
    x[3, :40] = 0.0
    x[5, 7] = float("nan")
    x[6, 9] = float("inf")
    x[7] = torch.randint(-24, 25, (96,), generator=g) / 4  # ties
    x[8, :] = 1e-41  # subnormals
    return [x, torch.randn(3, 5, 70, generator=g), x.bfloat16(), x[:9].double()]


def torch_path(monkeypatch) -> None:
    monkeypatch.setattr(fast, "enabled", lambda: False)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("preset", ALL)
@pytest.mark.parametrize("rounding", ["rne", "stochastic"])
def test_quantize_on_device_equals_cpu(device, preset, rounding, monkeypatch):
    """Fused CPU result (the reference) == PyTorch path on ``device``, every preset, RNE and SR."""
    for x in inputs():
        for axis in (-1, 0):
            ref = quantize(x, preset, axis=axis, rounding=rounding, generator=7)
            with monkeypatch.context() as m:
                torch_path(m)
                got = quantize(x.to(device), preset, axis=axis, rounding=rounding, generator=7)
            assert got.device.type == device and got.dtype == x.dtype
            torch.testing.assert_close(got.cpu(), ref, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("preset", ["mxfp4", "nvfp4", "fp8_e4m3", "fp8_e4m3_row", "mxint8",
                                    "nvfp4_rht", "bf16"])
def test_encode_on_device_equals_cpu(device, preset):
    x = inputs()[1]
    ref = encode(x, preset, rounding="stochastic", generator=3)
    got = encode(x.to(device), preset, rounding="stochastic", generator=3)
    assert got.codes.device.type == device
    assert torch.equal(got.codes.cpu(), ref.codes)
    if ref.scales is not None:
        assert torch.equal(got.scales.cpu().view(torch.uint8), ref.scales.view(torch.uint8))
    torch.testing.assert_close(got.dequantize().cpu(), ref.dequantize(), rtol=0, atol=0,
                               equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("element", ["e2m1", "e4m3", "e5m2", "e3m2", "int4", "bf16", "fp16"])
def test_cast_on_device_equals_cpu(device, element):
    for x in inputs():
        for rounding in ("rne", "stochastic"):
            ref = cast(x, element, rounding, generator=5)
            got = cast(x.to(device), element, rounding, generator=5)
            torch.testing.assert_close(got.cpu(), ref, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
def test_sr_keys_and_uniforms_do_not_depend_on_the_device(device):
    """An int seed makes a CPU generator; the global RNG draws keys on the CPU too."""
    assert make_generator(9, torch.device(device)).device.type == "cpu"
    x = torch.empty(1000, device=device)
    a = uniform_like(x, make_generator(9, x.device)).cpu()
    b = uniform_like(torch.empty(1000), make_generator(9, torch.device("cpu")))
    assert torch.equal(a, b)
    torch.manual_seed(4)
    k1 = draw_key(None)
    torch.manual_seed(4)
    u = uniform_like(x, None).cpu()
    assert torch.equal(u, counter_uniforms(torch.arange(1000), k1))


def test_counter_hash_int_ops_match_the_fused_kernel():
    """The torch (int64 ops) hash is the numba kernel's i32 hash, also for indices >= 2^32."""
    if not fast.enabled():
        pytest.skip("fast path off")
    key = (123456789, 987654321)
    idx = torch.cat([torch.arange(0, 5000), torch.arange((1 << 32) - 50, (1 << 32) + 50),
                     torch.tensor([(1 << 40) + 12345, (1 << 62) + 7])])
    u = counter_uniforms(idx, key)
    from numba import njit

    @njit
    def kernel(index, k0, k1):
        out = index.astype(fast.np.float32)
        for i in range(index.shape[0]):
            out[i] = fast._u01(index[i], k0, k1)
        return out

    got = torch.from_numpy(kernel(idx.numpy(), *key))
    assert torch.equal(u, got)


def test_butterfly_hadamard_is_the_rotation_matrix():
    x = torch.randn(6, 200, dtype=torch.float64)
    for size in (16, 32, 64, 128):
        r = rht(x, size, 5, -1)
        pad = torch.nn.functional.pad(x, (0, -x.shape[-1] % size))
        exact = rht_matrix(size, 5).double().sign() / size**0.5  # float64 D H / sqrt(n)
        ref = (pad.reshape(6, -1, size) @ exact).reshape(pad.shape)
        torch.testing.assert_close(r, ref, rtol=0, atol=1e-12)
        torch.testing.assert_close(irht(r, size, 5, -1, 200), x, rtol=0, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("specs", ["mxfp4", "nvfp4_rht", "fp8_e4m3_tile128",
                                   GemmSpecs(fprop="fp8_e4m3", dgrad="mxfp8_e4m3", wgrad="nvfp4")])
def test_qlinear_on_device(device, specs):
    """QLinear on ``device``: same quantized operands as the CPU (checked through an all-exact
    setting: a layer whose GEMMs are then compared within fp32 tolerance) and SR gradients
    reproducible from the layer seed."""
    torch.manual_seed(0)
    lin = QLinear(64, 48, specs=specs, seed=3)
    x = torch.randn(4, 16, 64)
    ys, grads = [], []
    for dev in ("cpu", device):
        layer = QLinear(64, 48, specs=specs, seed=3).to(dev)
        layer.load_state_dict(lin.state_dict())
        xi = x.to(dev).requires_grad_(True)
        y = layer(xi)
        y.square().sum().backward()
        ys.append(y.detach().cpu())
        grads.append((xi.grad.cpu(), layer.weight.grad.cpu()))
    # the same quantized operands on both devices; only the fp32 GEMM's summation order (and
    # TF32-free cuBLAS vs CPU BLAS) differs: ~K x 2^-24 relative for K=64, well inside 1e-5; the
    # gradients pass through one more GEMM and a stochastic rounding whose coins are equal
    torch.testing.assert_close(ys[1], ys[0], rtol=1e-5, atol=1e-5)
    for a, b in zip(grads[0], grads[1], strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
