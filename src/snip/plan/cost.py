"""Cost model: FLOPs, FP4-FLOP fraction, relative GEMM time and memory of a precision table.

Everything here is computed from module *shapes* (``in_features``, ``out_features``), never from
data, so it works on a model built on the ``meta`` device: a 70B Llama costs nothing to inspect.

Formulas, for a linear layer ``Y = X W^T`` with ``K = in_features``, ``N = out_features`` and
``T`` tokens per step (batch x sequence):

* FLOPs.  Each of the three training GEMMs is a ``(T x K) . (K x N)``-sized product, so
  ``F_fprop = F_dgrad = F_wgrad = 2 T K N`` (one multiply and one add per MAC).  A layer costs
  ``6 T K N``; for a whole model, ``2 x 3 x (linear parameters)`` FLOPs per token.
* FP4-FLOP fraction (SNIP's efficiency measure, paper section 5).  The share of linear-layer
  GEMM FLOPs whose spec has a 4-bit element (:func:`snip.formats.is_fp4`):
  ``sum_{l,g} F_{l,g} [spec_{l,g} is 4-bit] / sum_{l,g} F_{l,g}``.  ``T`` cancels.
* Relative GEMM time under a :class:`~snip.plan.profiles.ThroughputProfile` with speed-up
  ``s(spec)`` over BF16: ``sum_{l,g} F_{l,g} / s(spec_{l,g}) / sum_{l,g} F_{l,g}``.  1.0 means
  "as fast as all-BF16"; 0.25 is the best an all-FP4 plan can do on GB200.  It counts peak GEMM
  rates only: quantization kernels, attention and communication are not in it.
* Weight bytes: ``K N x bits_per_element(spec_fprop.for_weight()) / 8`` -- the weight as the
  forward GEMM stores it, block scales included (per-tensor and per-row scales excluded).
* Saved-activation bytes: backward keeps the layer input ``X`` (``T x K``) for the wgrad GEMM,
  stored in the format that GEMM consumes: ``T K x bits_per_element(spec_wgrad) / 8``.

Which layers: the keys of the table.  A :class:`~snip.plan.PrecisionPlan` resolves to the
quantizable linear layers (every ``nn.Linear`` except an LM head called ``output``/``lm_head``,
unless the plan names it), so fractions are over the layers the plan governs, as in the paper
("linear layers inside the transformer blocks").  :func:`linear_layers` is the enumeration both
this module and the plan use.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from snip.errors import UserError
from snip.formats import is_fp4
from snip.nn import DEFAULT_SKIP_NAMES, ResolvesToSpecs
from snip.nn.conv1d import is_conv1d
from snip.nn.specs import Gemm, GemmSpecs
from snip.plan.profiles import ThroughputProfile, get_profile

HEAD_NAMES = DEFAULT_SKIP_NAMES  # the layers snip.convert leaves alone by default

Table = Mapping[str, GemmSpecs]
Resolvable = ResolvesToSpecs  # anything with a ``resolve(model)`` (a PrecisionPlan)


def is_head(name: str) -> bool:
    """True for the LM head: the last name component is ``output`` or ``lm_head``."""
    return name.rpartition(".")[2] in HEAD_NAMES


def linear_layers(model: nn.Module, *, include_head: bool = False) -> dict[str, nn.Module]:
    """Every ``nn.Linear`` (``QLinear`` included) and Hugging Face ``Conv1D`` (GPT-2's
    transposed linear layer) by qualified name, in module order.

    Without ``include_head`` these are exactly the layers ``snip.convert`` converts by default.
    """
    return {name: m for name, m in model.named_modules()
            if (isinstance(m, nn.Linear) or is_conv1d(m)) and (include_head or not is_head(name))}


def linear_shape(m: nn.Module) -> tuple[int, int]:
    """``(in_features, out_features)`` of a linear layer (a ``Conv1D`` stores ``(in, out)``)."""
    if is_conv1d(m):
        n_in, n_out = m.weight.shape
        return int(n_in), int(n_out)
    return m.in_features, m.out_features


def as_table(table_or_plan: Table | Resolvable, model: nn.Module) -> Table:
    if isinstance(table_or_plan, ResolvesToSpecs):
        return table_or_plan.resolve(model)
    return table_or_plan


def _check_tokens(tokens: int) -> int:
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise UserError(f"tokens must be a positive int (batch x sequence length), got {tokens!r}")
    return tokens


def _shapes(model: nn.Module, names: Iterable[str]) -> dict[str, tuple[int, int]]:
    """``(in_features, out_features)`` of the named linear layers."""
    linears = linear_layers(model, include_head=True)
    missing = [n for n in names if n not in linears]
    if missing:
        raise UserError(f"{missing[0]!r} is not a linear layer of this model "
                        f"({len(missing)} such name(s)); resolve the plan against this model")
    return {n: linear_shape(linears[n]) for n in names}


def gemm_flops(model: nn.Module, tokens: int = 1,
               names: Iterable[str] | None = None) -> dict[str, dict[Gemm, int]]:
    """FLOPs of each GEMM of each linear layer for ``tokens`` tokens (``2 T K N`` each)."""
    _check_tokens(tokens)
    names = list(linear_layers(model)) if names is None else list(names)
    return {n: dict.fromkeys(Gemm, 2 * tokens * k * n_out)
            for n, (k, n_out) in _shapes(model, names).items()}


def layer_flops(model: nn.Module, tokens: int = 1,
                names: Iterable[str] | None = None) -> dict[str, int]:
    """Training FLOPs per layer (fprop + dgrad + wgrad)."""
    return {n: sum(g.values()) for n, g in gemm_flops(model, tokens, names).items()}


def total_flops(model: nn.Module, tokens: int = 1, names: Iterable[str] | None = None) -> int:
    return sum(layer_flops(model, tokens, names).values())


def fp4_flop_fraction(table_or_plan: Table | Resolvable, model: nn.Module,
                      tokens: int = 1) -> float:
    """Share of the table's linear-layer GEMM FLOPs that run with a 4-bit element."""
    table = as_table(table_or_plan, model)
    flops = gemm_flops(model, tokens, table)
    total = sum(sum(g.values()) for g in flops.values())
    fp4 = sum(f for n, g in flops.items() for gemm, f in g.items() if is_fp4(table[n].get(gemm)))
    return fp4 / total if total else 0.0


def relative_gemm_time(table_or_plan: Table | Resolvable, model: nn.Module, tokens: int = 1,
                       profile: ThroughputProfile | str | Path | Mapping = "blackwell") -> float:
    """GEMM time of the table relative to running every one of its GEMMs in BF16."""
    table, prof = as_table(table_or_plan, model), get_profile(profile)
    flops = gemm_flops(model, tokens, table)
    total = sum(sum(g.values()) for g in flops.values())
    time = sum(f / prof.speed(table[n].get(gemm))
               for n, g in flops.items() for gemm, f in g.items())
    return time / total if total else 1.0


@dataclass(frozen=True, kw_only=True)
class LayerMemory:
    """Bytes one layer stores: its weight, and the input it saves for backward."""

    name: str
    weight_format: str
    weight_bytes: float
    activation_format: str
    activation_bytes: float


@dataclass(frozen=True)
class MemoryEstimate:
    layers: tuple[LayerMemory, ...]

    @property
    def weight_bytes(self) -> float:
        return sum(m.weight_bytes for m in self.layers)

    @property
    def activation_bytes(self) -> float:
        return sum(m.activation_bytes for m in self.layers)

    @property
    def total_bytes(self) -> float:
        return self.weight_bytes + self.activation_bytes

    def by_format(self) -> dict[str, dict[str, float]]:
        """``{"weights": {format: bytes}, "activations": {format: bytes}}``."""
        out: dict[str, dict[str, float]] = {"weights": {}, "activations": {}}
        for m in self.layers:
            w, a = out["weights"], out["activations"]
            w[m.weight_format] = w.get(m.weight_format, 0.0) + m.weight_bytes
            a[m.activation_format] = a.get(m.activation_format, 0.0) + m.activation_bytes
        return out


def memory(table_or_plan: Table | Resolvable, model: nn.Module, tokens: int = 1) -> MemoryEstimate:
    """Weight and saved-activation bytes of every layer of the table (formulas above)."""
    _check_tokens(tokens)
    table = as_table(table_or_plan, model)
    rows = []
    for name, (k, n) in _shapes(model, table).items():
        w_spec, a_spec = table[name].fprop.for_weight(), table[name].wgrad
        rows.append(LayerMemory(
            name=name, weight_format=table[name].fprop.name,
            weight_bytes=k * n * w_spec.bits_per_element / 8,
            activation_format=a_spec.name,
            activation_bytes=tokens * k * a_spec.bits_per_element / 8))
    return MemoryEstimate(tuple(rows))
