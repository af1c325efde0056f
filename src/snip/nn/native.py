"""Native FP8 GEMMs: ``torch._scaled_mm`` on the element codes instead of fake-quantized fp32.

Emulation (the default, :class:`GemmImpl` ``EMULATED``) multiplies fp32 tensors that hold the
dequantized values ``q * s``.  A hardware FP8 GEMM takes the codes ``q`` (as ``float8_e4m3fn`` /
``float8_e5m2``) and the decode scales apart and computes ``(q_a s_a) @ (q_b s_b)`` with the scales
applied to the fp32 accumulator.  ``torch._scaled_mm(a, b, scale_a, scale_b, out_dtype)`` does
that for two scale shapes:

* tensorwise: one fp32 scale per operand (``scale_a``, ``scale_b`` of one element) -- the
  ``fp8_e4m3`` / ``fp8_e5m2`` presets (``Scaling.TENSOR``);
* rowwise: ``scale_a`` of shape ``(M, 1)``, ``scale_b`` of shape ``(1, N)`` -- one scale per row
  of ``a`` and per column of ``b``, i.e. per slice along the contraction axis: the
  ``fp8_e4m3_row`` preset (``Scaling.CHANNEL``).

Block-scaled formats (1x128 tiles, MX, NVFP4) and FP4/FP6 keep running emulated.  Layout rules
(cuBLASLt): ``a`` row-major ``(M, K)``, ``b`` column-major ``(K, N)`` (we pass the transpose of a
row-major ``(N, K)``), ``K`` and ``N`` multiples of 16 on CUDA, no e5m2 x e5m2 product, rowwise
output in bf16.  A GEMM that breaks a rule runs emulated.

What is exact: the codes times the scales are *the* emulated operands, bit for bit (the same
amax, scales, rounding and stochastic-rounding counters; :func:`fp8_operand`), so native and
emulated differ only in where the scales are multiplied in and in the accumulation order (fp32
accumulators on both; bf16 output where the hardware demands it).
:func:`snip.nn.diagnostics.native_sqnr` measures that difference per GEMM.

Hardware: FP8 tensor cores need CUDA compute capability >= 8.9 (Ada, Hopper, Blackwell) or a
ROCm MI300; ``torch._scaled_mm`` also runs (slowly) on the CPU, which is how the tests check the
wiring.  Elsewhere ``gemm="native"`` falls back to emulation with one warning, or raises a clear
error when ``strict``.
"""

from __future__ import annotations

import functools
import os
import warnings
from dataclasses import dataclass

import torch

from snip.errors import UserError
from snip.formats import QTensor, QuantSpec, Rounding, ScaleFormat, Scaling
from snip.formats.quantize import grid_values
from snip.formats.scaling import RowShard

_FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def native_spec(spec: QuantSpec) -> bool:
    """Whether a spec's operands can feed ``torch._scaled_mm``: FP8 elements, one fp32 scale per
    tensor or per contraction slice, no Hadamard rotation."""
    return (spec.element.name in _FP8 and spec.scaling in (Scaling.TENSOR, Scaling.CHANNEL)
            and spec.scale_format is ScaleFormat.FP32 and not spec.hadamard)


@functools.cache
def _cpu_scaled_mm() -> bool:
    if not hasattr(torch, "_scaled_mm"):
        return False
    try:
        a = torch.zeros(16, 16, dtype=torch.float8_e4m3fn)
        one = torch.ones((), dtype=torch.float32)
        torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
    except (RuntimeError, NotImplementedError, TypeError):
        return False
    return True


def fp8_gemm_supported(device: torch.device | str) -> bool:
    """Whether ``torch._scaled_mm`` runs FP8 GEMMs on ``device``: CUDA capability >= 8.9, ROCm
    (MI300 class), or the CPU where this torch implements it (slowly; for tests)."""
    device = torch.device(device)
    if not hasattr(torch, "_scaled_mm"):
        return False
    if device.type == "cpu":
        return _cpu_scaled_mm()
    if device.type == "cuda":
        if torch.version.hip:
            name = torch.cuda.get_device_properties(device).gcnArchName
            return name.startswith(("gfx94", "gfx95", "gfx12"))
        return torch.cuda.get_device_capability(device) >= (8, 9)
    return False


_warned: set[str] = set()


def resolve_native(device: torch.device, strict: bool) -> bool:
    """Whether ``gemm="native"`` can run on ``device``; otherwise warn once per device type and
    fall back to emulation, or raise (``strict``)."""
    if fp8_gemm_supported(device):
        return True
    msg = (f"gemm='native' needs FP8 GEMM hardware (CUDA compute capability >= 8.9 or ROCm "
           f"MI300) or torch._scaled_mm on the CPU; {_describe(device)} has none")
    if strict:
        raise UserError(f"{msg}; use gemm='emulated' or strict=False to fall back")
    if device.type not in _warned:
        _warned.add(device.type)
        warnings.warn(f"{msg}: running the FP8 GEMMs emulated", RuntimeWarning, stacklevel=3)
    return False


def _describe(device: torch.device) -> str:
    if device.type == "cuda" and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(device)
        return f"{torch.cuda.get_device_name(device)} (compute capability {major}.{minor})"
    return f"device {device}"


def _amax(x: torch.Tensor, dim: int | None) -> torch.Tensor:
    return x.abs().amax() if dim is None else x.abs().amax(dim=dim)


def _codes(x: torch.Tensor, enc: torch.Tensor, m: float, fp8: torch.dtype) -> torch.Tensor:
    return (x * enc).clamp(-m, m).to(fp8)


_COMPILED: list = []


def compiled_quantizer(device: torch.device):
    """``(amax, codes)`` compiled with ``torch.compile`` (one fused pass each instead of ~5
    eager ones) when ``SNIP_FP8_COMPILE=1`` and ``device`` is CUDA; else ``None``.  Opt-in
    until ``benchmarks/gpu_check.py`` has shown on a GPU that it gives the eager bits."""
    if device.type != "cuda" or os.environ.get("SNIP_FP8_COMPILE", "0") != "1":
        return None
    if not _COMPILED:
        _COMPILED.extend(torch.compile(f) for f in (_amax, _codes))
    return _COMPILED


@dataclass(frozen=True)
class Fp8Operand:
    """One GEMM operand as ``torch._scaled_mm`` takes it: ``codes`` ``(rows, K)`` row-major with
    the contraction axis last, and the fp32 decode ``scale`` (one element, or ``(rows, 1)``)."""

    codes: torch.Tensor
    scale: torch.Tensor

    def dequantize(self) -> torch.Tensor:
        """``codes * scale`` in fp32: the emulated operand (contraction axis last)."""
        return self.codes.float() * self.scale


def fp8_operand(x: torch.Tensor, spec: QuantSpec, axis: int, rounding: Rounding,
                generator: torch.Generator | int | None,
                shard: RowShard | None = None) -> Fp8Operand:
    """Quantize a 2-D operand along ``axis`` (its GEMM's contraction axis) into FP8 codes and
    scales, with the contraction axis last.  ``codes * scale`` equals
    ``quantize(x, spec, axis=axis, ...)`` (transposed when ``axis`` is 0), bit for bit."""
    fp8 = _FP8[spec.element.name]
    along_rows = axis in (0, -2)
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        x = x.float()  # the emulated operands are fp32 (quantize_operand)
    if rounding is Rounding.RNE:
        # the emulated cast for RNE FP8 is ``(x * encode).clamp(+-max).to(fp8)``: do only that
        from snip.formats.scaling import scales_from_amax

        fused = compiled_quantizer(x.device)
        dim = None if spec.scaling is Scaling.TENSOR else (0 if along_rows else 1)
        amax = (fused[0] if fused else _amax)(x, dim).float().reshape(-1, 1)
        sc = scales_from_amax(amax, spec)
        # never a 0-dim scale: bf16 * 0-dim fp32 would stay bf16 (torch's type promotion)
        enc = sc.encode.reshape(1, 1) if spec.scaling is Scaling.TENSOR else (
            sc.encode.reshape(1, -1) if along_rows else sc.encode)
        codes = (fused[1] if fused else _codes)(x, enc, spec.element.max_normal, fp8)
        # row-major as _scaled_mm wants it (elementwise ops keep a strided input's layout)
        codes = codes.t().contiguous() if along_rows else codes.contiguous()
        return Fp8Operand(codes, sc.decode.reshape(()) if spec.scaling is Scaling.TENSOR
                          else sc.decode.reshape(-1, 1))
    layout, q, sc = grid_values(x.float(), spec, axis=axis, rounding=rounding,
                                generator=generator, shard=shard)
    if spec.scaling is Scaling.TENSOR:
        codes = q.reshape(x.shape).to(fp8)
        codes = codes.t().contiguous() if along_rows else codes
        return Fp8Operand(codes, sc.decode.reshape(()))
    return Fp8Operand(q.to(fp8), sc.decode.reshape(-1, 1))  # blocks are the slices already


def axis_free(spec: QuantSpec, rounding: Rounding | None = None) -> bool:
    """Whether an operand's FP8 codes do not depend on the quantization axis: one tensor scale
    and round-to-nearest (no counter-indexed coins), so the codes along axis 0 are the codes
    along axis -1, transposed -- quantized once, used by two GEMMs."""
    rounding = spec.rounding if rounding is None else rounding
    return native_spec(spec) and spec.scaling is Scaling.TENSOR and rounding is Rounding.RNE


def transposed(op: Fp8Operand) -> Fp8Operand:
    """The same tensor-scaled codes with the other axis last."""
    if op.scale.numel() != 1:
        raise ValueError("only tensor-scaled FP8 codes can be transposed")
    return Fp8Operand(op.codes.t().contiguous(), op.scale)


def fp8_from_qtensor(qt: QTensor) -> Fp8Operand:
    """The :class:`Fp8Operand` of a packed 2-D operand (``encode`` of a :func:`native_spec`
    spec): FP8 codes are the raw bytes of ``float8_e4m3fn`` / ``float8_e5m2``."""
    fp8 = _FP8[qt.spec.element.name]
    codes = qt.codes.view(fp8).reshape(qt.grid_shape)
    along_rows = qt.axis == 0
    if qt.spec.scaling is Scaling.TENSOR:
        codes = codes.reshape(qt.shape)
        codes = codes.t().contiguous() if along_rows else codes
        return Fp8Operand(codes, qt.scales.float().reshape(()))
    return Fp8Operand(codes, qt.scales.float().reshape(-1, 1))


def shapes_ok(a: Fp8Operand, b: Fp8Operand) -> bool:
    """cuBLASLt's rules for one product ``a (M, K) @ b^T`` with ``b`` given as ``(N, K)``."""
    if a.codes.device.type != "cuda":
        return True
    (m, k), n = a.codes.shape, b.codes.shape[0]
    both_e5m2 = a.codes.dtype == b.codes.dtype == torch.float8_e5m2
    return k % 16 == 0 and n % 16 == 0 and m % 16 == 0 and not both_e5m2


def scaled_mm(a: Fp8Operand, b: Fp8Operand, *, fast_accum: bool = False,
              bias: torch.Tensor | None = None) -> torch.Tensor:
    """``(a.codes * a.scale) @ (b.codes * b.scale)^T`` in fp32 (bf16 internally where the
    hardware only writes bf16: rowwise on CUDA), plus ``bias`` in fp32."""
    rowwise = a.scale.numel() > 1 or b.scale.numel() > 1 or (
        a.scale.dim() == 2 or b.scale.dim() == 2)
    sa, sb = a.scale, b.scale
    if rowwise:  # both operands must be rowwise; a tensor scale broadcasts
        sa = sa.reshape(-1, 1).expand(a.codes.shape[0], 1).contiguous()
        sb = sb.reshape(1, -1).expand(1, b.codes.shape[0]).contiguous()
    else:
        sa, sb = sa.reshape(()), sb.reshape(())
    cuda = a.codes.device.type == "cuda"
    out_dtype = torch.bfloat16 if rowwise and cuda else torch.float32
    y = torch._scaled_mm(a.codes, b.codes.t(), scale_a=sa, scale_b=sb, out_dtype=out_dtype,
                         use_fast_accum=fast_accum and cuda)
    y = y.float()
    return y if bias is None else y + bias.float()


def sqnr_db(reference: torch.Tensor, test: torch.Tensor) -> float:
    """``10 log10(|ref|^2 / |ref - test|^2)`` in dB (inf when equal)."""
    ref, err = reference.double(), (reference.double() - test.double())
    noise = float(err.pow(2).sum())
    signal = float(ref.pow(2).sum())
    if noise == 0.0:
        return float("inf")
    return 10.0 * float(torch.log10(torch.tensor(signal / noise)))
