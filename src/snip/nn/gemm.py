"""The three GEMMs of a linear layer, each in its own number format (one autograd Function).

A linear layer ``Y = X W^T + b`` with ``X: (T, K)`` (T tokens, K = in_features) and
``W: (N, K)`` (N = out_features) runs three matrix products per training step::

    fprop   Y  = Q(X) Q(W)^T      contraction over K  (in_features)
    dgrad   dX = Q(dY) Q(W)       contraction over N  (out_features)
    wgrad   dW = Q(dY)^T Q(X)     contraction over T  (tokens)

``Q`` is fake quantization (:func:`snip.formats.quantize`: quantize, then dequantize in fp32)
with that GEMM's :class:`~snip.formats.QuantSpec`.  Block scales must be shared along the axis a
GEMM *sums over* -- a hardware low-precision GEMM multiplies one scale per operand block into
each partial sum -- so every operand is re-quantized per GEMM along its contraction axis:

=========  ================================  ===================================
GEMM       first operand                     second operand
=========  ================================  ===================================
fprop      X (T, K) along K  (axis -1)       W (N, K) along K  (axis -1)
dgrad      dY (T, N) along N (axis -1)       W (N, K) along N  (axis 0)
wgrad      dY (T, N) along T (axis 0)        X (T, K) along T  (axis 0)
=========  ================================  ===================================

Layers that read one input one after the other (q, k and v; gate and up) quantize it once per
pass when it rounds to nearest: the next layer takes the previous one's ``Q(X)``
(:class:`_LastInput`).  Leading dimensions of ``X`` are flattened into the token axis ``T``.
Weights use ``spec.for_weight()``: with ``weight_2d`` specs (NVFP4, the 128x128 FP8/FP4 tiles)
that is a 2-D tile, whose scale does not depend on the axis, so ``Q(W)`` of fprop *is* ``Q(W)``
of dgrad when both GEMMs share the spec -- it is quantized once and reused
(:func:`weight_reusable`).

Gradient operands (``dY``) round with ``spec.grad_rounding`` (stochastic for the FP4 presets: an
unbiased gradient estimate).  Every stochastic draw comes from a generator seeded by
``(layer seed, step, gemm, operand)`` (:func:`operand_seed`): a run is reproducible, and each step
sees fresh noise.  A GEMM whose spec is the identity (fp32) is a plain fp32 matmul, with the same
kernels as ``F.linear``, so an all-fp32 layer equals ``F.linear`` bit for bit.

Products accumulate in fp32 (``Accum.FP32``, the default: bit-reproducible on every machine).
``Accum.BF16`` runs the product on bf16 operands and returns a bf16 result (fp32 accumulation
inside the kernel, bf16 output -- what FP8/FP4 tensor-core GEMMs write).  ``Accum.AUTO`` is
``BF16`` where the hardware multiplies bf16 natively (CPU flags ``amx_bf16`` or ``avx512_bf16``,
or a CUDA device; :func:`bf16_gemm_native`) and ``FP32`` elsewhere: on AMX/AVX512-BF16 CPUs a
bf16 GEMM is 2-6x faster than fp32, on AVX2-only CPUs ~70x slower.

What is exact.  For specs whose dequantized values are bf16 numbers (:func:`bf16_exact`: at most
8 significant bits per element and power-of-two scales, e.g. MXFP4/6/8) the cast of the operands
to bf16 loses nothing, so ``BF16`` multiplies exactly the operands ``FP32`` multiplies; the
results differ only by the kernel's summation order and the final rounding of each output to
bf16 (tests check both).  For other specs (fp32-scaled tiles, NVFP4's fp32 tensor scale) the
operands are rounded to bf16 as well; choose ``BF16``/``AUTO`` there knowingly.
The bias is added in fp32.  Under ``torch.autocast`` every operand is quantized in fp32 and the
output is returned in the autocast dtype; gradients come back in each input's own dtype.

``GemmImpl.NATIVE`` (``gemm="native"``) runs every GEMM whose spec is tensor- or row-scaled FP8
through ``torch._scaled_mm`` on the FP8 codes (:mod:`snip.nn.native`); the other GEMMs, and
hardware without FP8 GEMMs (one warning, or an error when ``strict``), stay emulated.  The
operands are the emulated ones bit for bit; the products differ by fp32 rounding (and bf16
output for rowwise scales on CUDA): :func:`snip.nn.diagnostics.native_sqnr` reports by how much.

What backward needs is saved in one of two ways (:class:`SaveMode`): ``HP`` keeps ``X`` and
``W`` in high precision and re-quantizes them in backward (as torchao's float8 training does);
``ENCODED`` keeps real packed :class:`~snip.formats.QTensor` s of exactly the operands the
backward GEMMs consume -- ``Q_wgrad(X)`` along tokens and ``Q_dgrad(W)`` along out_features --
and dequantizes them in backward.  Both give bit-identical gradients: ``encode(x).dequantize()``
equals ``quantize(x)``, and a stochastic operand uses the same seed in either place.

Two code paths run these steps.  The default settings (``HP``, emulated GEMMs:
:func:`plain_route`) take :func:`hp_forward` and :func:`hp_backward`, straight-line and what
``torch.compile`` traces too: their operand calls are found once per layer setting and operand
shapes (:class:`HpPlan`), so each operand costs one kernel call.  ``ENCODED`` and
``gemm="native"`` take the general :func:`linear_forward` and :func:`linear_backward`, which
handle every setting (``HP`` too, where a native GEMM falls back to emulation) through
:func:`quantize_operand`.  A test holds the two to the same bits.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import os
import threading
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from snip.errors import UserError
from snip.formats import (
    Kind,
    QTensor,
    QuantSpec,
    Rounding,
    ScaleFormat,
    Scaling,
    encode,
    fast,
    quantize,
)
from snip.formats.scaling import RowShard
from snip.nn.native import (
    Fp8Operand,
    axis_free,
    fp8_from_qtensor,
    fp8_operand,
    native_spec,
    resolve_native,
    scaled_mm,
    shapes_ok,
    transposed,
)
from snip.nn.specs import (
    Accum,
    Gemm,
    GemmImpl,
    GemmSpecs,
    SaveMode,
    as_accum,
    as_gemm_impl,
    as_save_mode,
)

_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


@functools.cache
def _cpu_has_bf16() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return any(flag in line.split() for flag in _BF16_FLAGS)
    except OSError:
        pass
    return False


def bf16_gemm_native(device: torch.device | str = "cpu") -> bool:
    """Whether a bf16 GEMM runs natively (fast) here: a CUDA device, or a CPU with AMX-BF16 or
    AVX512-BF16 dot products.  ``SNIP_BF16_GEMM=1``/``0`` overrides the detection."""
    forced = os.environ.get("SNIP_BF16_GEMM")
    if forced in ("0", "1"):
        return forced == "1"
    return torch.device(device).type == "cuda" or _cpu_has_bf16()


def bf16_exact(spec: QuantSpec) -> bool:
    """True when every value ``quantize(x, spec)`` can return is a bf16 number (barring values
    below 2^-126, which no realistic scale produces): elements with at most 8 significant bits
    times power-of-two scales (e8m0, or fp32 scales rounded to powers of two)."""
    e = spec.element
    if spec.scaling is Scaling.NONE:
        return e.name == "bf16"
    significant = e.int_max.bit_length() if e.kind is Kind.INT else e.mbits + 1
    pow2 = spec.scale_format is ScaleFormat.E8M0 or (
        spec.scale_format is ScaleFormat.FP32 and spec.pow2_scales)
    return significant <= 8 and pow2 and not spec.hadamard


class Operand(enum.Enum):
    INPUT = "input"
    WEIGHT = "weight"
    GRAD_OUTPUT = "grad_output"


@dataclass(frozen=True, kw_only=True)
class GemmConfig:
    """Everything one call of the Function needs besides the tensors."""

    specs: GemmSpecs
    seed: int = 0
    step: int = 0
    save: SaveMode = SaveMode.HP
    accum: Accum = Accum.FP32
    out_dtype: torch.dtype | None = None  # None: the input's dtype
    gemm: GemmImpl = GemmImpl.EMULATED
    strict: bool = False  # gemm="native" without FP8 hardware: error instead of emulating
    tokens: RowShard | None = None  # these tokens' place in a larger batch (SR counters)

    def __post_init__(self) -> None:
        object.__setattr__(self, "save", as_save_mode(self.save))
        object.__setattr__(self, "accum", as_accum(self.accum))
        object.__setattr__(self, "gemm", as_gemm_impl(self.gemm))
        # the HpPlans of this config's calls by operand shapes (hp_plan; not a field: shared
        # by its at_step copies, not compared, hashed or pickled)
        object.__setattr__(self, "_plans", {})

    def at_step(self, step: int) -> GemmConfig:
        """This config at another step, without re-validating the fields (a per-call copy)."""
        c = object.__new__(GemmConfig)
        c.__dict__.update(self.__dict__)
        c.__dict__["step"] = step
        return c

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_plans", None)  # kernel calls: made again where the config is unpickled
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__dict__["_plans"] = {}


@dataclass
class SavedBytes:
    """Bytes a forward pass left for backward, beyond the parameters themselves."""

    activation: int = 0  # X, or what replaces it
    weight: int = 0      # quantized copies of W (the Parameter itself is not counted)


def operand_seed(seed: int, step: int, gemm: Gemm, operand: Operand) -> int:
    """A 63-bit seed for one operand's stochastic rounding, stable across processes."""
    return _tagged_seed(seed, step, f"{gemm.value}:{operand.value}")


def _tagged_seed(seed: int, step: int, tag: str) -> int:
    """:func:`operand_seed` with its GEMM and operand as the ``tag`` ``"<gemm>:<operand>"``."""
    key = f"{seed}:{step}:{tag}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


def quantize_operand(x: torch.Tensor, spec: QuantSpec, axis: int, rounding: Rounding,
                     seed: int, tokens: RowShard | None = None,
                     bf16: bool = False, activation: bool = False) -> torch.Tensor:
    """Fake-quantize one GEMM operand in fp32 (identity specs pass the fp32 tensor through).
    ``tokens``: for a token-major operand (``X``, ``dY``), its rows' place in the whole batch.
    ``bf16``: the operand of a bf16 GEMM (:func:`bf16_operands`), returned as the bf16 tensor
    the GEMM would cast it to, in the quantizer's own pass.  ``activation``: ``X`` or ``dY``,
    which change only through writes their version counter sees, so a statistic of the whole
    tensor (NVFP4's amax) is kept on it for the other GEMM that quantizes it
    (``reuse_amax`` of :func:`snip.formats.fast.quantize_fused`); never a weight, which an
    optimizer or a user may write through ``.data``."""
    x = _as_dtype(x, torch.float32)
    if spec.is_identity:
        return x
    out = torch.bfloat16 if bf16 else torch.float32
    call = fast.planned(x, spec, axis, rounding, out, tokens)  # the call quantize() would make
    if call is not None:
        return call(x, seed, activation)
    gen = seed if rounding is Rounding.STOCHASTIC else None
    return quantize(x, spec, axis=axis, rounding=rounding, generator=gen, shard=tokens,
                    dtype=out)


_QUANTIZE_OPERAND = quantize_operand  # (replaced in this module: HpPlan calls the replacement)


class _LastInput(threading.local):
    """The last token-major input one GEMM quantized with round-to-nearest, and the result.

    Layers that share an input -- q, k and v of an attention block, gate and up of a SwiGLU --
    quantize the same ``X`` with the same spec one after the other, in fprop and again in wgrad;
    with RNE (no seed) the results are equal, so the second and third layers take the first
    one's (:func:`_input`).  An entry matches the same data: same storage address and strides,
    and the same version counter (which every in-place write bumps, as autograd's saved-tensor
    checks rely on), quantized by the same call (which fixes spec, axis, shape and input and
    output dtypes); it holds its source, so the address cannot be reused while it lives.  One
    entry per thread and GEMM: it holds one operand beyond its use until the next call, and
    the other pass's first call drops it (:func:`hp_forward`, :func:`hp_backward` and their
    general twins).
    """

    entry: tuple | None = None  # (source, key, quantized source)


_FPROP_X, _WGRAD_X = _LastInput(), _LastInput()


def bf16_operands(accum: Accum, x: torch.Tensor) -> bool:
    """Whether the GEMMs multiply bf16 operands (``Accum.BF16``, or ``AUTO`` where bf16 GEMMs
    are native on ``x``'s device, read only then): every quantized operand is then made in
    bf16 directly (same values as the fp32 one cast to bf16, one pass and half the bytes
    fewer)."""
    return accum is Accum.BF16 or (accum is Accum.AUTO and bf16_gemm_native(x.device))


def _seed(cfg: GemmConfig, gemm: Gemm, operand: Operand, rounding: Rounding) -> int:
    """The operand's SR seed, or 0 where it rounds to nearest (no draw: the hash is skipped)."""
    return _seed_of(cfg, _tag(rounding, gemm, operand))


_NO_CONTEXT = nullcontext()  # reusable: it keeps no state


def _device_type(x: torch.Tensor) -> str:
    """``x.device.type``, with CPU tensors answered without building a device (this and
    :func:`_no_autocast` run twice a layer step; in a training step such calls cost several
    times their isolated time, RESULTS §7k)."""
    return "cpu" if x.is_cpu else x.device.type


def _no_autocast(device_type: str):
    """Autocast off inside the Function (a no-op context when it is off already: ~20 us)."""
    if torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return _NO_CONTEXT


def encode_operand(x: torch.Tensor, spec: QuantSpec, axis: int, rounding: Rounding,
                   seed: int, tokens: RowShard | None = None) -> QTensor:
    """Like :func:`quantize_operand`, but keep real packed storage."""
    gen = seed if rounding is Rounding.STOCHASTIC else None
    return encode(x.float(), spec, axis=axis, rounding=rounding, generator=gen, shard=tokens)


def _axis_free_rne(a: QuantSpec, b: QuantSpec, rounding: str) -> bool:
    """True when quantizing one operand with ``a`` along one axis equals quantizing it with
    ``b`` along the other: the same spec, a scale that does not depend on the axis (none, or
    one per tensor), round-to-nearest-even (no per-GEMM stochastic stream), no rotation."""
    return (a == b and not a.is_identity and a.scaling in (Scaling.NONE, Scaling.TENSOR)
            and not a.hadamard and getattr(a, rounding) is Rounding.RNE)


def input_reusable(fprop: QuantSpec, wgrad: QuantSpec) -> bool:
    """True when ``Q_fprop(X)`` along in_features equals ``Q_wgrad(X)`` along tokens (bf16, or
    one tensor scale, with the same spec): fprop's quantized ``X`` is then saved for wgrad."""
    return _axis_free_rne(fprop, wgrad, "rounding")


def grad_reusable(dgrad: QuantSpec, wgrad: QuantSpec) -> bool:
    """True when ``Q_dgrad(dY)`` along out_features equals ``Q_wgrad(dY)`` along tokens:
    ``dY`` is then quantized once for both backward GEMMs."""
    return _axis_free_rne(dgrad, wgrad, "grad_rounding")


def weight_reusable(fprop: QuantSpec, dgrad: QuantSpec) -> bool:
    """True when ``Q_fprop(W)`` along in_features equals ``Q_dgrad(W)`` along out_features.

    That holds when both GEMMs use the same weight spec and its scales do not depend on the
    axis: one tensor scale, or square 2-D tiles (the Hadamard rotation is axis-bound).
    """
    w = fprop.for_weight()
    axis_free = w.scaling in (Scaling.NONE, Scaling.TENSOR, Scaling.BLOCK2D)
    return w == dgrad.for_weight() and axis_free and not w.hadamard


def _dgrad_takes_fprop_weight(specs: GemmSpecs) -> bool:
    """Whether fprop's ``Q(W)`` can be kept as dgrad's operand (``SaveMode.HP``): the weight is
    reusable (:func:`weight_reusable`) and dgrad quantizes it at all.  (A native FP8 dgrad
    that wants its own codes is :func:`_fprop_weight`'s check.)"""
    d = specs.dgrad.for_weight()
    return not d.is_identity and weight_reusable(specs.fprop, specs.dgrad)


@dataclass(frozen=True)
class _Route:
    """What one ``GemmSpecs`` lets a call reuse, decided once per specs (each check compares
    whole specs: about a microsecond a call otherwise)."""

    fprop_w: QuantSpec  # fprop's weight spec (2-D tiles where ``weight_2d``)
    dgrad_w: QuantSpec  # dgrad's weight spec
    reuse_w: bool  # fprop's Q(W) can be dgrad's operand (_dgrad_takes_fprop_weight)
    reuse_x: bool  # fprop's Q(X) is wgrad's operand (input_reusable)
    reuse_dy: bool  # one Q(dY) for dgrad and wgrad (grad_reusable)


@functools.lru_cache(maxsize=1024)
def _route(specs: GemmSpecs) -> _Route:
    return _Route(fprop_w=specs.fprop.for_weight(), dgrad_w=specs.dgrad.for_weight(),
                  reuse_w=_dgrad_takes_fprop_weight(specs),
                  reuse_x=input_reusable(specs.fprop, specs.wgrad),
                  reuse_dy=grad_reusable(specs.dgrad, specs.wgrad))


def matmul(a: torch.Tensor, b: torch.Tensor, accum: Accum,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """``a @ b (+ bias)`` in the accumulation precision; the bias is added in fp32."""
    if accum is Accum.AUTO:
        accum = Accum.BF16 if bf16_gemm_native(a.device) else Accum.FP32
    if accum is Accum.BF16:
        out = (a.bfloat16() @ b.bfloat16()).float()
        return out if bias is None else out + bias.float()
    if bias is None:
        return torch.mm(a, b)  # (what ``a @ b`` runs for matrices, without its dispatch)
    return torch.addmm(bias.float(), a, b)  # the kernel F.linear uses: identity stays exact


def linear(a: torch.Tensor, w: torch.Tensor, accum: Accum,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`matmul` of ``a`` and ``w.t()`` (fprop's ``Q(X) Q(W)^T + b``); in fp32 through
    ``F.linear``, the same ``mm`` / ``addmm`` with the transpose made in C++ (no view op from
    Python)."""
    if accum is Accum.FP32:
        return F.linear(a, w, None if bias is None else _as_dtype(bias, torch.float32))
    return matmul(a, w.t(), accum, bias)


class _Saved:
    """Forward-side bookkeeping: what backward gets of ``X`` and ``W``, and its cost in bytes.

    ``w_quantized`` marks a ``W`` that is already ``Q_dgrad(W)`` (reused from fprop).  The
    object itself waits on the autograd ``ctx`` for backward (:meth:`stash`, :meth:`unstash`).
    """

    def __init__(self, cfg: GemmConfig, native: bool = False, bf16: bool = False,
                 record: SavedBytes | None = None) -> None:
        self.cfg = cfg
        self.route = _route(cfg.specs)
        self.native = native  # gemm="native" resolved to run on this device
        if record is None:
            record = SavedBytes()
        else:  # the call's record starts empty, and is filled as operands are kept
            record.activation, record.weight = 0, 0
        self.bytes = record
        self.x: torch.Tensor | QTensor | None = None
        self.w: torch.Tensor | QTensor | None = None
        # between forward and backward: what is not a plain tensor of (x, w); None once freed
        self.packed: tuple[QTensor | Fp8Operand | None, ...] | None = (None, None)
        self.w_quantized = False
        self.x_quantized = False  # x is already Q_wgrad(X) (reused from fprop)
        self.dy: tuple[QuantSpec, Fp8Operand] | None = None  # native: dY codes shared by GEMMs
        self.bf16 = bf16  # the emulated GEMMs take bf16 operands (bf16_operands)

    @property
    def accum(self) -> Accum:
        """The emulated GEMMs' arithmetic as resolved once in forward (``AUTO`` decided), so
        that backward multiplies the operands it made in the precision they were made for."""
        return Accum.BF16 if self.bf16 else Accum.FP32

    def keep(self, value: torch.Tensor | QTensor | Fp8Operand, *, weight: bool,
             counted: bool = True) -> None:
        n = _nbytes(value) if counted else 0
        if weight:
            self.w, self.bytes.weight = value, self.bytes.weight + n
        else:
            self.x, self.bytes.activation = value, self.bytes.activation + n

    def stash(self, ctx) -> None:
        """Hand ``x`` and ``w`` over to ``ctx``: plain tensors through ``save_for_backward``
        (version checks, saved-tensor hooks), packed operands kept here; this object waits on
        ``ctx`` for backward."""
        ctx.save_for_backward(*(v if isinstance(v, torch.Tensor) else None
                                for v in (self.x, self.w)))
        self.packed = tuple(None if isinstance(v, torch.Tensor) else v for v in (self.x, self.w))
        self.x = self.w = None
        ctx.saved = self

    @staticmethod
    def unstash(ctx) -> _Saved:
        """The forward's :class:`_Saved`, with ``x`` and ``w`` back.  A second backward
        (``retain_graph=True``) works unless the first freed packed operands."""
        saved: _Saved = ctx.saved
        tx, tw = ctx.saved_tensors
        if saved.packed is None:
            raise RuntimeError(
                "a second backward through a snip layer whose packed operands (save='encoded', "
                "or gemm='native' FP8 codes) the first backward freed; use save='hp' and "
                "gemm='emulated' to backward twice through one forward")
        px, pw = saved.packed
        saved.x, saved.w = px if tx is None else tx, pw if tw is None else tw
        return saved

    def release(self) -> None:
        """After backward: drop the operands (autograd frees its saved tensors, and packed
        ones would otherwise live as long as the graph)."""
        if self.packed is not None and any(v is not None for v in self.packed):
            self.packed = None
        self.x = self.w = self.dy = None


def _nbytes(v: torch.Tensor | QTensor | Fp8Operand) -> int:
    if isinstance(v, Fp8Operand):
        return v.codes.numel() + v.scale.numel() * 4
    return v.nbytes if isinstance(v, QTensor) else v.numel() * v.element_size()


# ---- the general path's operands (cfg and bf16: the call's; route: its specs') ----------------

def _fprop_input(x2: torch.Tensor, cfg: GemmConfig, bf16: bool) -> torch.Tensor:
    """``Q_fprop(X)`` along in_features (the previous layer's where it read the same ``X``)."""
    f = cfg.specs.fprop
    return _input(_FPROP_X, _bound(x2, f, -1, f.rounding, cfg.tokens, bf16), x2, cfg,
                  _tag(f.rounding, Gemm.FPROP, Operand.INPUT))


def _dgrad_weight(weight: torch.Tensor, cfg: GemmConfig, route: _Route,
                  bf16: bool) -> torch.Tensor:
    """``Q_dgrad(W)`` along out_features."""
    w = route.dgrad_w
    return quantize_operand(weight, w, 0, w.rounding,
                            _seed(cfg, Gemm.DGRAD, Operand.WEIGHT, w.rounding), bf16=bf16)


def _wgrad_input(x2: torch.Tensor, cfg: GemmConfig, bf16: bool) -> torch.Tensor:
    """``Q_wgrad(X)`` along tokens (the previous layer's where it read the same ``X``)."""
    w = cfg.specs.wgrad
    return _input(_WGRAD_X, _bound(x2, w, 0, w.rounding, cfg.tokens, bf16), x2, cfg,
                  _tag(w.rounding, Gemm.WGRAD, Operand.INPUT))


def _grad_output(dy2: torch.Tensor, cfg: GemmConfig, bf16: bool, gemm: Gemm,
                 axis: int) -> torch.Tensor:
    """``Q(dY)`` with ``gemm``'s spec (dgrad or wgrad) along ``axis``."""
    spec = cfg.specs.dgrad if gemm is Gemm.DGRAD else cfg.specs.wgrad
    seed = _seed(cfg, gemm, Operand.GRAD_OUTPUT, spec.grad_rounding)
    return quantize_operand(dy2, spec, axis, spec.grad_rounding, seed, cfg.tokens, bf16=bf16,
                            activation=True)


def _fprop_weight(weight: torch.Tensor, saved: _Saved, keep: bool) -> torch.Tensor:
    """``Q_fprop(W)``; with ``keep``, also decides what backward keeps of ``W``."""
    cfg, route = saved.cfg, saved.route
    f, d = route.fprop_w, route.dgrad_w
    if cfg.save is SaveMode.ENCODED:
        seed = operand_seed(cfg.seed, cfg.step, Gemm.FPROP, Operand.WEIGHT)
    else:
        seed = _seed(cfg, Gemm.FPROP, Operand.WEIGHT, f.rounding)
    bf16 = saved.bf16
    if not keep:
        return quantize_operand(weight, f, -1, f.rounding, seed, bf16=bf16)
    if d.is_identity:
        saved.keep(weight, weight=True, counted=False)
        return quantize_operand(weight, f, -1, f.rounding, seed, bf16=bf16)
    reuse = route.reuse_w and not (saved.native and native_spec(d))  # native: dgrad's own codes
    if cfg.save is SaveMode.ENCODED:
        dseed = seed if reuse else operand_seed(cfg.seed, cfg.step, Gemm.DGRAD, Operand.WEIGHT)
        qt = encode_operand(weight, d, 0, d.rounding, dseed)
        saved.keep(qt, weight=True)
        return qt.dequantize(torch.float32) if reuse else quantize_operand(
            weight, f, -1, f.rounding, seed, bf16=bf16)
    wq = quantize_operand(weight, f, -1, f.rounding, seed, bf16=bf16)
    if reuse:
        saved.keep(wq, weight=True)
        saved.w_quantized = True
    else:
        saved.keep(weight, weight=True, counted=False)
    return wq


def _save_input(x2: torch.Tensor, saved: _Saved, xq: torch.Tensor | None = None) -> None:
    """What wgrad gets of ``X``; ``xq`` (fprop's ``Q(X)``) is kept instead of ``X`` when it is
    also wgrad's operand (:func:`input_reusable`) and takes the same bytes (fp32 ``X``)."""
    cfg, w = saved.cfg, saved.cfg.specs.wgrad
    if (xq is not None and saved.route.reuse_x and cfg.save is SaveMode.HP
            and x2.dtype == torch.float32):
        saved.keep(xq, weight=False)
        saved.x_quantized = True
    elif cfg.save is SaveMode.ENCODED and not w.is_identity:
        seed = operand_seed(cfg.seed, cfg.step, Gemm.WGRAD, Operand.INPUT)
        saved.keep(encode_operand(x2, w, 0, w.rounding, seed, cfg.tokens), weight=False)
    else:
        saved.keep(x2, weight=False)


def _as_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t.to(dtype)`` without the call when it would return ``t`` (a microsecond a call)."""
    return t if t.dtype == dtype else t.to(dtype)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a matrix of rows (leading dimensions flattened)."""
    return t if t.dim() == 2 else t.reshape(-1, t.shape[-1])


def linear_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   cfg: GemmConfig, needs_backward: bool,
                   record: SavedBytes | None = None) -> tuple[torch.Tensor, _Saved]:
    """fprop ``Q(X) Q(W)^T + b`` and what backward keeps (:class:`_Saved`, nothing without
    ``needs_backward``; its bytes go to ``record`` if given); the output has ``x``'s leading
    shape and ``cfg.out_dtype``."""
    native = cfg.gemm is GemmImpl.NATIVE and resolve_native(x.device, cfg.strict)
    _WGRAD_X.entry = None  # (the last backward's operand: not needed until the next backward)
    with _no_autocast(_device_type(x)):
        x2 = _rows(x)
        saved = _Saved(cfg, native, bf16_operands(cfg.accum, x), record)
        y = _native_fprop(x2, weight, bias, saved, needs_backward) if native else None
        if y is None:
            wq = _fprop_weight(weight, saved, needs_backward)
            xq = _fprop_input(x2, cfg, saved.bf16)
            if needs_backward:
                _save_input(x2, saved, xq)
            y = linear(xq, wq, saved.accum, bias)
    if x.dim() != 2:
        y = y.reshape(*x.shape[:-1], -1)
    return _as_dtype(y, cfg.out_dtype or x.dtype), saved


def linear_backward(dy: torch.Tensor, saved: _Saved, x_shape: torch.Size, x_dtype: torch.dtype,
                    w_dtype: torch.dtype, b_dtype: torch.dtype | None, need_x: bool,
                    need_w: bool, need_b: bool) -> tuple[torch.Tensor | None, ...]:
    """dgrad, wgrad and the bias gradient (``None`` where not needed) from what forward kept."""
    _FPROP_X.entry = None  # (the forward's last operand: not needed until the next forward)
    with _no_autocast(_device_type(dy)):
        dy2 = _rows(dy)
        # native GEMMs quantize a bf16 dY as is (same bits: the scale multiply promotes)
        dy2 = dy2 if saved.native else _as_dtype(dy2, torch.float32)
        dx = dw = db = None
        dyq = None  # Q(dY) shared by dgrad and wgrad (grad_reusable)
        if need_x and need_w and not saved.native and saved.route.reuse_dy:
            dyq = _grad_output(dy2, saved.cfg, saved.bf16, Gemm.DGRAD, -1)
        if need_x:
            dx = _dgrad(dy2, saved, dyq)
            dx = _as_dtype(dx if len(x_shape) == 2 else dx.reshape(x_shape), x_dtype)
        if need_w:
            dw = _as_dtype(_wgrad(dy2, saved, dyq), w_dtype)
        if need_b and b_dtype is not None:
            db = _as_dtype(_as_dtype(dy2, torch.float32).sum(0), b_dtype)
    return dx, dw, db


def plain_route(cfg: GemmConfig) -> bool:
    """Whether a call takes :func:`hp_forward` and :func:`hp_backward`: the default settings
    (``SaveMode.HP``, emulated GEMMs), which every preset trains with unless told otherwise."""
    return cfg.save is SaveMode.HP and cfg.gemm is GemmImpl.EMULATED


@dataclass(frozen=True)
class _General:
    """:func:`quantize_operand` for one operand kind that no one-pass kernel call serves (or an
    input that is not fp32: it is cast first), called like a kernel call: ``(t, seed,
    activation)``.  Equal for equal fields, so layers sharing an input share its memo entry."""

    spec: QuantSpec
    axis: int
    rounding: Rounding
    tokens: RowShard | None
    bf16: bool
    shape: torch.Size  # the operand's (it decides the output, and the memo compares calls)
    dtype: torch.dtype

    def __call__(self, t: torch.Tensor, seed: int, activation: bool) -> torch.Tensor:
        return quantize_operand(t, self.spec, self.axis, self.rounding, seed, self.tokens,
                                bf16=self.bf16, activation=activation)


# an operand's quantizer: a kernel call (fast.planned) or _General, or None for an identity spec
_Call = Callable[[torch.Tensor, int, bool], torch.Tensor]


def _bound(t: torch.Tensor, spec: QuantSpec, axis: int, rounding: Rounding,
           tokens: RowShard | None, bf16: bool) -> _Call | None:
    """The call :func:`quantize_operand` makes for operands like ``t`` (same shape, dtype and
    device), found once: ``None`` for an identity spec (the operand as fp32).  Where
    ``quantize_operand`` has been replaced (a profiler's or a test's wrapper), every call goes
    through the replacement (:class:`_General`)."""
    if spec.is_identity:
        return None
    if t.dtype == torch.float32 and quantize_operand is _QUANTIZE_OPERAND:
        call = fast.planned(t, spec, axis, rounding, torch.bfloat16 if bf16 else torch.float32,
                            tokens)
        if call is not None:
            return call
    return _General(spec, axis, rounding, tokens, bf16, t.shape, t.dtype)


class HpPlan:
    """Every operand call of one layer call with the default settings (:func:`plain_route`),
    found once per (specs, tokens, input and weight shapes and dtypes, bf16 operands, CPU or
    not, ``SNIP_FAST``, the ``quantize_operand`` in force): each a one-pass kernel call (or
    the general ``quantize`` path where none applies), the :func:`operand_seed` tag of each
    operand that rounds stochastically, and what the specs let the call reuse.
    :func:`hp_forward` and :func:`hp_backward` then spend no Python on specs per operand: the
    same calls :func:`quantize_operand` would make, with the same seeds."""

    __slots__ = ("w_f", "x_f", "w_d", "dy_d", "dy_w", "x_w", "t_wf", "t_xf", "t_wd", "t_dyd",
                 "t_dyw", "t_xw", "reuse_w", "reuse_dy", "x_q", "accum", "y_shape")

    def __init__(self, cfg: GemmConfig, x: torch.Tensor, x2: torch.Tensor, weight: torch.Tensor,
                 bf16: bool) -> None:
        s, route, tok = cfg.specs, _route(cfg.specs), cfg.tokens
        f, d, w = s.fprop, s.dgrad, s.wgrad
        # dY's shape, dtype and device (planning reads no data: one element, broadcast)
        dy2 = x2.new_empty(1, dtype=torch.float32).expand(x2.shape[0], weight.shape[0])
        fw, dw = route.fprop_w, route.dgrad_w
        self.w_f = _bound(weight, fw, -1, fw.rounding, None, bf16)  # Q_fprop(W)
        self.x_f = _bound(x2, f, -1, f.rounding, tok, bf16)  # Q_fprop(X)
        self.w_d = None if route.reuse_w else _bound(weight, dw, 0, dw.rounding, None, bf16)
        self.dy_d = _bound(dy2, d, -1, d.grad_rounding, tok, bf16)  # Q_dgrad(dY)
        self.dy_w = _bound(dy2, w, 0, w.grad_rounding, tok, bf16)  # Q_wgrad(dY)
        self.x_w = _bound(x2, w, 0, w.rounding, tok, bf16)  # Q_wgrad(X)
        # the operands that draw a seed, by their operand_seed tag (None: round to nearest)
        self.t_wf, self.t_xf, self.t_wd = (_tag(fw.rounding, Gemm.FPROP, Operand.WEIGHT),
                                           _tag(f.rounding, Gemm.FPROP, Operand.INPUT),
                                           _tag(dw.rounding, Gemm.DGRAD, Operand.WEIGHT))
        self.t_dyd, self.t_dyw, self.t_xw = (
            _tag(d.grad_rounding, Gemm.DGRAD, Operand.GRAD_OUTPUT),
            _tag(w.grad_rounding, Gemm.WGRAD, Operand.GRAD_OUTPUT),
            _tag(w.rounding, Gemm.WGRAD, Operand.INPUT))
        self.reuse_w, self.reuse_dy = route.reuse_w, route.reuse_dy
        # backward gets fprop's Q(X) where it is wgrad's operand and as small as X
        self.x_q = route.reuse_x and x2.dtype == torch.float32
        self.accum = Accum.BF16 if bf16 else Accum.FP32
        # Y's shape where X is not a matrix (Y is made as rows, then viewed)
        self.y_shape = None if x.dim() == 2 else (*x.shape[:-1], weight.shape[0])


_PLANS_KEPT = 64  # plans one config keeps (one per input shape a run feeds the layer)


def hp_plan(cfg: GemmConfig, x: torch.Tensor, x2: torch.Tensor, weight: torch.Tensor,
            bf16: bool) -> HpPlan:
    """The :class:`HpPlan` of a call (``x2``: the input ``x`` as rows), made once and kept on
    the config (shared by its :meth:`~GemmConfig.at_step` copies: one per layer setting)."""
    plans = cfg._plans
    key = (x.shape, x2.dtype, weight.shape, weight.dtype, bf16, x2.is_cpu, fast.enabled(),
           quantize_operand)
    plan = plans.get(key)
    if plan is None:
        if len(plans) >= _PLANS_KEPT:
            plans.clear()
        plan = plans[key] = HpPlan(cfg, x, x2, weight, bf16)
    return plan


def _input(memo: _LastInput, call: _Call | None, x2: torch.Tensor, cfg: GemmConfig,
           tag: str | None) -> torch.Tensor:
    """``X`` quantized by ``call`` (``tag``: its seed's, ``None`` for round to nearest), taken
    from ``memo`` where the previous layer quantized the same data with the same call (RNE
    only: a stochastic draw depends on the layer's seed, while RNE draws no coins, so the
    tokens' place does not matter; and not inference tensors, which have no version
    counter)."""
    if call is None:
        return _as_dtype(x2, torch.float32)
    if tag is not None or x2.is_inference():
        return call(x2, _seed_of(cfg, tag), True)
    key = (x2.data_ptr(), x2.stride(), x2._version, call)  # the call fixes spec, shape, dtype
    e = memo.entry
    if e is not None and e[1] == key:
        return e[2]
    out = call(x2, 0, True)
    memo.entry = (x2, key, out)
    return out


def _tag(rounding: Rounding, gemm: Gemm, operand: Operand) -> str | None:
    """The :func:`operand_seed` tag of an operand that rounds stochastically, else ``None``."""
    return f"{gemm.value}:{operand.value}" if rounding is Rounding.STOCHASTIC else None


def _seed_of(cfg: GemmConfig, tag: str | None) -> int:
    """The operand's seed at ``cfg``'s step (0 for round to nearest: no draw)."""
    return 0 if tag is None else _tagged_seed(cfg.seed, cfg.step, tag)


def _made(call: _Call | None, t: torch.Tensor, cfg: GemmConfig, tag: str | None,
          activation: bool) -> torch.Tensor:
    """``t`` quantized by its plan's ``call`` with its seed (as fp32 for an identity spec)."""
    return _as_dtype(t, torch.float32) if call is None else call(t, _seed_of(cfg, tag),
                                                                   activation)


# What hp_forward keeps for hp_backward besides X and W (or their reused quantized copies): the
# config, the call's plan (whose reuse_w says whether W is kept quantized), and whether X is.
HpKept = tuple[GemmConfig, HpPlan, bool]


def hp_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               cfg: GemmConfig, needs_backward: bool, record: SavedBytes | None = None
               ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None, HpKept]:
    """:func:`linear_forward` for :func:`plain_route` configs, the same operand calls through
    the call's :class:`HpPlan`: ``Y``, the two tensors backward needs (``None`` without
    ``needs_backward``) and what else :func:`hp_backward` takes.  Tests check that both paths
    give the same bits."""
    _WGRAD_X.entry = None  # (the last backward's operand: not needed until the next backward)
    with _no_autocast(_device_type(x)):
        x2 = _rows(x)
        plan = hp_plan(cfg, x, x2, weight, bf16_operands(cfg.accum, x))
        wq = _made(plan.w_f, weight, cfg, plan.t_wf, False)
        xq = _input(_FPROP_X, plan.x_f, x2, cfg, plan.t_xf)
        y = linear(xq, wq, plan.accum, bias)
    if plan.y_shape is not None:
        y = y.view(plan.y_shape)
    y = _as_dtype(y, cfg.out_dtype or x.dtype)
    kept = (xq if plan.x_q else x2, wq if plan.reuse_w else weight) if needs_backward else None
    if record is not None:
        record.activation = _nbytes(kept[0]) if kept else 0
        record.weight = _nbytes(wq) if kept and plan.reuse_w else 0
    return y, kept, (cfg, plan, plan.x_q)


def hp_backward(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, kept: HpKept,
                x_shape: torch.Size, x_dtype: torch.dtype, w_dtype: torch.dtype,
                b_dtype: torch.dtype | None, need_x: bool, need_w: bool, need_b: bool
                ) -> tuple[torch.Tensor | None, ...]:
    """:func:`linear_backward` for :func:`plain_route` configs: dgrad, wgrad and the bias
    gradient from the ``x`` and ``w`` :func:`hp_forward` kept (``X`` as rows, or its quantized
    copy; ``W`` or its quantized copy, as ``kept`` says)."""
    cfg, plan, x_q = kept
    _FPROP_X.entry = None  # (the forward's last operand: not needed until the next forward)
    with _no_autocast(_device_type(dy)):
        dy2 = _as_dtype(_rows(dy), torch.float32)
        dx = dw = db = None
        dyq = None  # Q(dY) shared by dgrad and wgrad (grad_reusable)
        if need_x:
            if not plan.reuse_w:  # (else w is the kept Q_fprop(W))
                w = _made(plan.w_d, w, cfg, plan.t_wd, False)
            dyq = _made(plan.dy_d, dy2, cfg, plan.t_dyd, True)
            dx = matmul(dyq, w, plan.accum)
            dx = _as_dtype(dx if len(x_shape) == 2 else dx.reshape(x_shape), x_dtype)
        if need_w:
            if not x_q:
                x = _input(_WGRAD_X, plan.x_w, x, cfg, plan.t_xw)
            if dyq is None or not plan.reuse_dy:
                dyq = _made(plan.dy_w, dy2, cfg, plan.t_dyw, True)
            dw = _as_dtype(matmul(dyq.t(), x, plan.accum), w_dtype)
        if need_b and b_dtype is not None:
            db = _as_dtype(dy2.sum(0), b_dtype)
    return dx, dw, db


def hp_rebuilt(x: torch.Tensor, weight: torch.Tensor, cfg: GemmConfig
               ) -> tuple[torch.Tensor, torch.Tensor, HpKept]:
    """What :func:`hp_forward` keeps, rebuilt from ``X`` and ``W`` (for a backward run apart
    from its forward, as the compiled ops do), as :func:`hp_backward`'s ``x``, ``w`` and
    ``kept``.  Every operand backward then quantizes has the bits the eager forward would have
    kept: ``X`` is re-quantized where the forward kept ``Q_fprop(X)``, which equals
    ``Q_wgrad(X)`` (:func:`input_reusable`: RNE, axis-free), and a reused ``Q_fprop(W)`` is
    recomputed with fprop's spec, axis and seed."""
    x2 = _rows(x)
    plan = hp_plan(cfg, x, x2, weight, bf16_operands(cfg.accum, x))
    w = _made(plan.w_f, weight, cfg, plan.t_wf, False) if plan.reuse_w else weight
    return x2, w, (cfg, plan, False)  # X re-quantized where forward kept Q_fprop(X): same bits


class QuantizedLinearFn(torch.autograd.Function):
    """``Y = Q(X) Q(W)^T + b`` with per-GEMM formats in forward and backward (see module doc)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                cfg: GemmConfig, record: SavedBytes | None, needs_backward: bool) -> torch.Tensor:
        ctx.meta = (x.shape, x.dtype, weight.dtype, None if bias is None else bias.dtype)
        if plain_route(cfg):
            y, tensors, ctx.hp = hp_forward(x, weight, bias, cfg, needs_backward, record)
            if tensors is not None:
                ctx.save_for_backward(*tensors)
            return y
        y, saved = linear_forward(x, weight, bias, cfg, needs_backward, record)
        saved.stash(ctx)
        ctx.hp = None
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        if ctx.hp is not None:
            x, w = ctx.saved_tensors
            grads = hp_backward(dy, x, w, ctx.hp, *ctx.meta, *ctx.needs_input_grad[:3])
            return *grads, None, None, None
        saved = _Saved.unstash(ctx)
        dx, dw, db = linear_backward(dy, saved, *ctx.meta, *ctx.needs_input_grad[:3])
        saved.release()
        return dx, dw, db, None, None, None


def _dgrad(dy2: torch.Tensor, saved: _Saved, dyq: torch.Tensor | None = None) -> torch.Tensor:
    """``dX = Q(dY) Q(W)``, both along out_features (``dyq``: ``Q(dY)`` if already computed)."""
    cfg, d = saved.cfg, saved.cfg.specs.dgrad
    if saved.native and native_spec(d) and not saved.w_quantized:
        out = _native_dgrad(dy2, saved)
        if out is not None:
            return out
    if isinstance(saved.w, QTensor):
        wq = saved.w.dequantize(torch.float32)
    elif isinstance(saved.w, Fp8Operand):  # native fprop's axis-free W codes
        wq = saved.w.dequantize()
    elif saved.w_quantized:
        wq = saved.w
    else:
        wq = _dgrad_weight(saved.w, cfg, saved.route, saved.bf16)
    if dyq is None:
        dyq = _grad_output(dy2, cfg, saved.bf16, Gemm.DGRAD, -1)
    return matmul(dyq, wq, saved.accum)


def _wgrad(dy2: torch.Tensor, saved: _Saved, dyq: torch.Tensor | None = None) -> torch.Tensor:
    """``dW = Q(dY)^T Q(X)``, both along tokens (``dyq``: ``Q(dY)`` if already computed)."""
    cfg, w = saved.cfg, saved.cfg.specs.wgrad
    if saved.native and native_spec(w):
        out = _native_wgrad(dy2, saved)
        if out is not None:
            return out
    if isinstance(saved.x, QTensor):
        xq = saved.x.dequantize(torch.float32)
    elif isinstance(saved.x, Fp8Operand):  # native fprop's axis-free X codes
        xq = saved.x.dequantize()
    elif saved.x_quantized:
        xq = saved.x
    else:
        xq = _wgrad_input(saved.x, cfg, saved.bf16)
    if dyq is None:
        dyq = _grad_output(dy2, cfg, saved.bf16, Gemm.WGRAD, 0)
    return matmul(dyq.t(), xq, saved.accum)


# ---- native FP8 GEMMs (gemm="native"): same operands, torch._scaled_mm ----------------------

def _fp8(x: torch.Tensor, spec: QuantSpec, axis: int, rounding: Rounding, seed: int,
         tokens: RowShard | None = None) -> Fp8Operand:
    return fp8_operand(x, spec, axis, rounding, seed if rounding is Rounding.STOCHASTIC else None,
                       tokens)


def _native_fprop(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  saved: _Saved, keep: bool) -> torch.Tensor | None:
    """``Q(X) Q(W)^T`` through ``_scaled_mm``, saving what backward needs; ``None`` when the
    fprop spec or the shapes need the emulated GEMM (nothing is saved then)."""
    cfg, f = saved.cfg, saved.cfg.specs.fprop
    if not native_spec(f) or not native_spec(f.for_weight()):
        return None
    wf = f.for_weight()
    a = _fp8(x2, f, -1, f.rounding, operand_seed(cfg.seed, cfg.step, Gemm.FPROP, Operand.INPUT),
             cfg.tokens)
    b = _fp8(weight, wf, -1, wf.rounding,
             operand_seed(cfg.seed, cfg.step, Gemm.FPROP, Operand.WEIGHT))
    if not shapes_ok(a, b):
        return None
    if keep:
        s = cfg.specs
        d = s.dgrad.for_weight()
        if axis_free(wf) and d == wf:  # the dgrad operand is these codes, transposed
            saved.keep(b, weight=True)
        elif cfg.save is SaveMode.ENCODED and not d.is_identity:
            dseed = operand_seed(cfg.seed, cfg.step, Gemm.DGRAD, Operand.WEIGHT)
            saved.keep(encode_operand(weight, d, 0, d.rounding, dseed), weight=True)
        else:
            saved.keep(weight, weight=True, counted=False)
        if axis_free(f) and s.wgrad == f:  # the wgrad operand is these codes, transposed
            saved.keep(a, weight=False)
        else:
            _save_input(x2, saved)
    return scaled_mm(a, b, fast_accum=True, bias=bias)


def _operand_along_rows(v: torch.Tensor | QTensor | Fp8Operand, spec: QuantSpec, seed: int,
                        tokens: RowShard | None = None) -> Fp8Operand:
    """A saved operand quantized along axis 0, codes transposed (contraction axis last)."""
    if isinstance(v, Fp8Operand):
        return transposed(v)
    if isinstance(v, QTensor):
        return fp8_from_qtensor(v)
    return _fp8(v, spec, 0, spec.rounding, seed, tokens)


def _native_dgrad(dy2: torch.Tensor, saved: _Saved) -> torch.Tensor | None:
    cfg, d = saved.cfg, saved.cfg.specs.dgrad
    wd = d.for_weight()
    if not native_spec(wd):
        return None
    a = _fp8(dy2, d, -1, d.grad_rounding,
             operand_seed(cfg.seed, cfg.step, Gemm.DGRAD, Operand.GRAD_OUTPUT), cfg.tokens)
    if axis_free(d, d.grad_rounding):
        saved.dy = (d, a)  # wgrad with the same spec takes these codes, transposed
    b = _operand_along_rows(saved.w, wd,
                            operand_seed(cfg.seed, cfg.step, Gemm.DGRAD, Operand.WEIGHT))
    return scaled_mm(a, b) if shapes_ok(a, b) else None


def _native_wgrad(dy2: torch.Tensor, saved: _Saved) -> torch.Tensor | None:
    cfg, w = saved.cfg, saved.cfg.specs.wgrad
    if saved.dy is not None and saved.dy[0] == w:
        a = transposed(saved.dy[1])
    else:
        a = _fp8(dy2, w, 0, w.grad_rounding,
                 operand_seed(cfg.seed, cfg.step, Gemm.WGRAD, Operand.GRAD_OUTPUT), cfg.tokens)
    b = _operand_along_rows(saved.x, w, operand_seed(cfg.seed, cfg.step, Gemm.WGRAD,
                                                     Operand.INPUT), cfg.tokens)
    return scaled_mm(a, b) if shapes_ok(a, b) else None


def autocast_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype ``F.linear`` would return for ``x`` here: the autocast dtype when active."""
    dev = _device_type(x)
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return x.dtype


def check_features(x: torch.Tensor, weight: torch.Tensor) -> None:
    """A ``UserError`` when ``x``'s last dimension is not the weight's ``in_features``."""
    if x.shape[-1] != weight.shape[1]:
        raise UserError(f"input has {x.shape[-1]} features, weight expects {weight.shape[1]}")


def quantized_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                     cfg: GemmConfig, record: SavedBytes | None = None) -> torch.Tensor:
    """Functional form: ``F.linear`` with per-GEMM formats; fills ``record`` if given."""
    check_features(x, weight)
    needs_backward = torch.is_grad_enabled() and (
        x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad))
    if _APPLY is not None and not torch._C._are_functorch_transforms_active():
        return _APPLY(x, weight, bias, cfg, record, needs_backward)
    return QuantizedLinearFn.apply(x, weight, bias, cfg, record, needs_backward)


# ``QuantizedLinearFn.apply`` without its Python part (what ``super().apply`` calls there):
# outside functorch transforms that part only unwraps dead functorch wrappers, ~5 us a call on
# every layer of every step.  A dead wrapper (a tensor escaped from a transform) raises
# functorch's "escaped" error in the forward's GEMM either way.  (``QuantizedLinearFn`` has no
# ``setup_context``, whose arguments ``Function.apply`` would bind.)  ``None`` where this
# torch has not these internals: ``Function.apply`` then, always.
_APPLY = (torch._C._FunctionBase.__dict__["apply"].__get__(None, QuantizedLinearFn)
          if "apply" in getattr(torch._C, "_FunctionBase", object).__dict__
          and hasattr(torch._C, "_are_functorch_transforms_active") else None)
