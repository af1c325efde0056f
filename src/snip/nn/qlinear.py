"""``QLinear``: an ``nn.Linear`` whose three GEMMs run in their own formats.

``QLinear`` *is* an ``nn.Linear`` (same ``weight`` and ``bias`` Parameters, same ``state_dict``
keys), so an optimizer built before conversion keeps its state and checkpoints load either way.
Its forward calls :class:`~snip.nn.gemm.QuantizedLinearFn` with a :class:`GemmSpecs` (fprop,
dgrad, wgrad), a per-layer integer ``seed`` and a ``step`` counter that advances on every forward:
stochastic rounding of gradients is seeded by ``(seed, step, gemm, operand)``, so a run is
reproducible and consecutive steps draw different noise.  (A recomputed forward under activation
checkpointing also advances the counter; rerun the forward with the same ``step`` if you need the
recomputation to match.)  ``tokens`` (a :class:`~snip.formats.scaling.RowShard`, or ``None``)
places this forward's tokens in a larger batch: data-parallel ranks that each set their share
round their activations and gradients with the coins of one process running the whole batch.

``enabled = False`` makes the layer a plain ``F.linear``; :func:`snip.nn.disabled` flips it for a
whole model.  After a forward that will be differentiated, ``saved_bytes`` holds the bytes kept
for backward beyond the Parameters (``saved_weight_bytes`` the quantized weight copies).
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F
from torch import nn

from snip.formats import QuantSpec
from snip.formats.scaling import RowShard
from snip.nn.gemm import (
    GemmConfig,
    SavedBytes,
    autocast_dtype,
    check_features,
    quantized_linear,
)
from snip.nn.ops import config_handle, quantized_linear_op
from snip.nn.specs import Accum, GemmImpl, GemmSpecs, SaveMode, as_accum, as_gemm_impl, as_save_mode


def as_gemm_specs(specs: GemmSpecs | QuantSpec | str) -> GemmSpecs:
    """A ``GemmSpecs``; a single spec or preset name means all three GEMMs use it."""
    if isinstance(specs, GemmSpecs):
        return specs
    if isinstance(specs, QuantSpec | str):
        return GemmSpecs.uniform(specs)
    raise TypeError(f"expected GemmSpecs, QuantSpec or a preset name, got {type(specs).__name__}")


# the attributes a GemmConfig is made of (besides the step and the output dtype)
_SETTINGS = frozenset({"specs", "seed", "save", "accum", "gemm", "gemm_strict", "tokens"})
_CONFIGS_KEPT = 16  # configs a layer keeps by settings (QLinear._kept)


class QLinear(nn.Linear):
    """Linear layer with per-GEMM quantization (fprop / dgrad / wgrad)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 specs: GemmSpecs | QuantSpec | str = "fp32", seed: int = 0,
                 save: SaveMode | str = SaveMode.HP, accum: Accum | str = Accum.FP32,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.specs = as_gemm_specs(specs)
        self.seed = int(seed)
        # the forward counter, a 0-d tensor so that a compiled graph advances it in place
        self._step = torch.zeros((), dtype=torch.int64, device="cpu")
        self.tokens: RowShard | None = None  # this forward's tokens in a larger batch (SR)
        self.save = as_save_mode(save)
        self.accum = as_accum(accum)
        self.enabled = True
        self._saved = SavedBytes()
        self.gemm = GemmImpl.EMULATED  # set_gemm: "native" runs FP8 GEMMs via torch._scaled_mm
        self.gemm_strict = False
        self.__dict__["_handle"] = self._new_handle()  # from now on kept by __setattr__

    def __setattr__(self, name: str, value) -> None:
        changed = name in _SETTINGS and "_handle" in self.__dict__ and (
            self.__dict__.get(name) != value)
        super().__setattr__(name, value)
        if changed:
            self.__dict__["_handle"] = self._new_handle()

    def __setstate__(self, state: dict) -> None:
        """Unpickled (another process has another registry): the handle is made anew (the
        kept configs' handles are dropped with them), and a pickle from before the step became a
        tensor gives its step counter over."""
        step = state.pop("step", None)
        state.pop("_cfgs", None)
        super().__setstate__(state)
        if step is not None:
            self.__dict__["_step"] = torch.tensor(int(step), dtype=torch.int64)
        self.__dict__["_handle"] = self._new_handle()

    def _new_handle(self) -> int:
        """The :mod:`snip.nn.ops` registry handle of this layer's settings (output dtype
        apart).  A plain ``int`` attribute: Dynamo guards on it, so a graph compiled for one
        setting recompiles when a setting changes, and never for the step counter."""
        entry = self._kept(self._key(None))
        if entry[1] is None:
            entry[1] = config_handle(entry[0])
        return entry[1]

    @classmethod
    def from_linear(cls, linear: nn.Linear, specs: GemmSpecs | QuantSpec | str, *,
                    seed: int = 0, save: SaveMode | str = SaveMode.HP,
                    accum: Accum | str = Accum.FP32) -> QLinear:
        """A ``QLinear`` sharing ``linear``'s Parameter objects (nothing is copied)."""
        with torch.device("meta"):  # skip allocating and initialising throwaway parameters
            q = cls(linear.in_features, linear.out_features, linear.bias is not None,
                    specs=specs, seed=seed, save=save, accum=accum)
        q.weight = linear.weight
        q.bias = linear.bias
        q.train(linear.training)
        return q

    def to_linear(self) -> nn.Linear:
        """A plain ``nn.Linear`` sharing this layer's Parameters."""
        with torch.device("meta"):
            lin = nn.Linear(self.in_features, self.out_features, self.bias is not None)
        lin.weight = self.weight
        lin.bias = self.bias
        lin.train(self.training)
        return lin

    def set_specs(self, specs: GemmSpecs | QuantSpec | str) -> None:
        """Switch formats (between steps); Parameters and the step counter are untouched."""
        self.specs = as_gemm_specs(specs)

    def set_gemm(self, gemm: GemmImpl | str, strict: bool = False) -> None:
        """``"native"``: run the tensor/row-scaled FP8 GEMMs with ``torch._scaled_mm``
        (:mod:`snip.nn.native`); without FP8 hardware warn once and emulate, or raise if
        ``strict``.  ``"emulated"`` (the default): fake-quantized fp32 GEMMs."""
        self.gemm = as_gemm_impl(gemm)
        self.gemm_strict = bool(strict)

    @property
    def step(self) -> int:
        """Forwards so far (or as set): seeds this layer's stochastic rounding."""
        return int(self._step)

    @step.setter
    def step(self, value: int) -> None:
        self._step.fill_(int(value))

    @property
    def saved_bytes(self) -> int:
        """Activation bytes the last differentiable forward kept for backward."""
        return self._saved.activation

    @property
    def saved_weight_bytes(self) -> int:
        """Bytes of quantized weight copies the last differentiable forward kept for backward."""
        return self._saved.weight

    def linear_weight(self) -> torch.Tensor:
        """The weight as ``F.linear`` takes it, ``(out_features, in_features)``."""
        return self.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.linear_weight()
        if not self.enabled or not x.is_floating_point():
            # an integer (or bool) input raises exactly the dtype error nn.Linear gives
            return F.linear(x, weight, self.bias)
        if not torch.compiler.is_compiling():
            return self._eager(x, weight)
        if self.save is SaveMode.HP and getattr(self, "gemm", GemmImpl.EMULATED) \
                is GemmImpl.EMULATED:
            return self._traced(x, weight)
        return self._quantized(x, weight)

    def _key(self, out_dtype: torch.dtype | None) -> tuple:
        """This layer's settings, and the output dtype (``None``: the input's)."""
        return (self.specs, self.seed, self.save, self.accum, out_dtype,
                getattr(self, "gemm", GemmImpl.EMULATED), getattr(self, "gemm_strict", False),
                getattr(self, "tokens", None))

    def _kept(self, key: tuple) -> list:
        """``[GemmConfig, registry handle or None]`` of the settings ``key``, made once and kept
        (the micro-batches of a step alternate their ``tokens``: without this every layer
        would validate a config and register a handle anew for each one, ~10 us)."""
        kept = self.__dict__.setdefault("_cfgs", {})
        entry = kept.get(key)
        if entry is None:
            if len(kept) >= _CONFIGS_KEPT:
                kept.clear()
            specs, seed, save, accum, out_dtype, gemm, strict, tokens = key
            entry = kept[key] = [GemmConfig(specs=specs, seed=seed, save=save, accum=accum,
                                            out_dtype=out_dtype, gemm=gemm, strict=strict,
                                            tokens=tokens), None]
        return entry

    def _config(self, out_dtype: torch.dtype) -> GemmConfig:
        """This layer's settings as a ``GemmConfig`` at step 0 with the forward's output dtype,
        validated once per setting; the last one a forward used is checked first (a tuple
        comparison, no hashing)."""
        key = self._key(out_dtype)
        cached = self.__dict__.get("_cfg")
        if cached is not None and cached[0] == key:
            return cached[1]
        cfg = self._kept(key)[0]
        self.__dict__["_cfg"] = (key, cfg)
        return cfg

    def _eager(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """The quantized call through the autograd Function, eagerly."""
        counter = _counter(self._step)
        if counter is None:
            step = int(self._step)
            self._step.add_(1)
        else:
            step = counter.value
            counter.value = step + 1
        cfg = self._config(autocast_dtype(x)).at_step(step)
        record = SavedBytes()
        y = quantized_linear(x, weight, self.bias, cfg, record)
        self.__dict__["_saved"] = record  # a plain attribute: skip nn.Module's __setattr__
        return y

    @torch.compiler.disable
    def _quantized(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """:meth:`_eager` under ``torch.compile`` for ``SaveMode.ENCODED`` and
        ``gemm="native"`` (packed operands and FP8 codes are no op outputs): one graph break
        per call."""
        return self._eager(x, weight)

    def _traced(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """The quantized call as :mod:`snip.nn.ops` custom ops, for ``torch.compile`` to trace:
        the same kernels and seeds as eager, no graph break; ``saved_bytes`` is not recorded."""
        check_features(x, weight)
        step = self._step.clone()
        self._step.add_(1)
        return quantized_linear_op(x, weight, self.bias, self._handle, autocast_dtype(x), step)[0]

    def extra_repr(self) -> str:
        s = self.specs
        formats = f"fprop={s.fprop.name}, dgrad={s.dgrad.name}, wgrad={s.wgrad.name}"
        extra = f", save={self.save.value}" if self.save is not SaveMode.HP else ""
        extra += f", accum={self.accum.value}" if self.accum is not Accum.FP32 else ""
        gemm = getattr(self, "gemm", GemmImpl.EMULATED)
        extra += f", gemm={gemm.value}" if gemm is not GemmImpl.EMULATED else ""
        return f"{super().extra_repr()}, {formats}{extra}"


def _counter(step: torch.Tensor) -> ctypes.c_int64 | None:
    """The int64 a 0-d CPU step tensor holds, as a ``ctypes`` view (``None`` for any other
    tensor): eager forwards read and advance the counter through it, for ~0.2 us instead of an
    ``item()`` and an ``add_`` (~3 and ~5-10 us, paid by every layer on every step).  Views are
    kept by address, like :func:`snip.formats.fast._np`'s: a view owns nothing, and for a live
    tensor at that address it is the view that would be made anew.  (The writes skip the
    tensor's version counter, which nothing reads for this tensor: it is never an autograd
    input, and a compiled graph reads its value, not its version.)"""
    if step.dtype != torch.int64 or not step.is_cpu or step.dim() != 0:
        return None
    address = step.data_ptr()
    view = _COUNTERS.get(address)
    if view is None:
        if len(_COUNTERS) >= _COUNTERS_MAX:
            _COUNTERS.clear()
        view = _COUNTERS[address] = ctypes.c_int64.from_address(address)
    return view


_COUNTERS: dict[int, ctypes.c_int64] = {}  # step counter views by address
_COUNTERS_MAX = 4096


def saved_activation_bytes(model: nn.Module) -> int:
    """Sum of ``QLinear.saved_bytes`` over a model (after a differentiable forward)."""
    return sum(m.saved_bytes for m in model.modules() if isinstance(m, QLinear))
