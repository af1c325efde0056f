"""Model conversion: swap linear layers for ``QLinear`` in place, switch formats, swap back.

``convert(model, what)`` walks the module tree and replaces each eligible ``nn.Linear`` -- and
each Hugging Face ``Conv1D`` (GPT-2's transposed linear layer, see :mod:`snip.nn.conv1d`) -- by
a :class:`~snip.nn.qlinear.QLinear` that *shares* its Parameters, so optimizer state,
``state_dict`` keys and weight tying are untouched.  ``what`` is a preset name, a ``QuantSpec`` or
a ``GemmSpecs`` (every converted layer gets it), or a precision plan: any object with
``resolve(model) -> Mapping[str, GemmSpecs]`` keyed by fully qualified module name, in which case
only the layers it names are converted.

By default the LM head stays in high precision (the NVFP4 recipe, torchao and Transformer
Engine all keep embeddings and head out of the low-precision GEMMs): modules whose
last name component is in ``skip_names`` (``output``, ``lm_head``) are left alone, as is anything
``filter_fn(module, fqn)`` rejects (torchao's ``module_filter_fn`` argument order).  Embeddings
are ``nn.Embedding``, never converted.

Conversion never fails silently.  Every call builds a :class:`Conversion` record -- the layers
converted (with their original class), the ones re-specified, and every *linear-like* module
skipped with its reason -- logs it and leaves it on ``model.snip_conversion``.  Converting nothing
is an error (the classic failure: a model whose projections are not ``nn.Linear`` trains entirely
in fp32 while its owner believes it is NVFP4); ``strict=True`` also rejects any linear-like module
left out for a reason other than the caller's own ``skip_names`` / ``filter_fn`` / plan, e.g. an
unknown ``...Linear`` class or ``nn.MultiheadAttention.out_proj`` (whose weight the attention
reads directly, so a wrapper would never run).

Each layer's stochastic-rounding seed is ``zlib.crc32(name)``: stable across processes and runs
(Python's ``hash`` of a string is salted per process).

Between steps, ``PrecisionPlan.apply`` (:mod:`snip.plan`, one layer up) changes the formats of
already converted layers through ``QLinear.set_specs`` (what the adaptive-precision controller
does); :func:`disabled` runs a block with every ``QLinear`` as a
plain fp32 ``F.linear`` (reference runs, sensitivity baselines), and :func:`plain_forward` says
whether a model's forward already is one; :func:`unconvert` undoes it all
(a converted ``Conv1D`` becomes a ``Conv1D`` again).
"""

from __future__ import annotations

import logging
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from snip.errors import UserError
from snip.formats import QuantSpec
from snip.nn.conv1d import QConv1D, is_conv1d
from snip.nn.gemm import bf16_operands
from snip.nn.qlinear import QLinear, as_gemm_specs
from snip.nn.specs import Accum, Gemm, GemmSpecs, SaveMode, as_accum, as_save_mode

FilterFn = Callable[[nn.Module, str], bool]
DEFAULT_SKIP_NAMES = ("output", "lm_head")
log = logging.getLogger(__name__)


@runtime_checkable
class ResolvesToSpecs(Protocol):
    """A precision plan: per-layer ``GemmSpecs`` for a given model."""

    def resolve(self, model: nn.Module) -> Mapping[str, GemmSpecs]: ...


PlanOrPreset = str | QuantSpec | GemmSpecs | ResolvesToSpecs

# why a linear-like module was left alone; the first three are the user's choice, the rest
# are modules snip cannot quantize (errors under strict=True)
SKIP_NAME, FILTERED, NOT_IN_PLAN = "skip_names", "filter_fn", "not in the plan"
DELIBERATE = (SKIP_NAME, FILTERED, NOT_IN_PLAN)


@dataclass(frozen=True)
class Skipped:
    """A linear-like module that ``convert`` left alone, and why."""

    name: str
    kind: str  # the module's class name
    reason: str


@dataclass(frozen=True)
class Conversion:
    """What one ``convert`` call did: ``model.snip_conversion`` after the call, also logged."""

    converted: tuple[tuple[str, str], ...] = ()  # (name, original class) newly wrapped
    updated: tuple[str, ...] = ()  # layers that were already QLinear and got new specs
    skipped: tuple[Skipped, ...] = ()

    @property
    def names(self) -> list[str]:
        """Every layer that now runs in the requested formats, in module order."""
        return [n for n, _ in self.converted] + list(self.updated)

    @property
    def unsupported(self) -> list[Skipped]:
        """Skipped modules the user did not exclude: what ``strict=True`` rejects."""
        return [s for s in self.skipped if s.reason not in DELIBERATE]

    def __str__(self) -> str:
        kinds = Counter(k for _, k in self.converted)
        parts = [f"converted {len(self.converted)} layers"
                 + (f" ({', '.join(f'{n} {k}' for k, n in kinds.items())})" if kinds else "")]
        if self.updated:
            parts.append(f"re-specified {len(self.updated)} QLinear layers")
        if self.skipped:
            shown = "; ".join(f"{s.name or '(root)'} [{s.kind}]: {s.reason}"
                              for s in self.skipped[:6])
            more = f"; ... {len(self.skipped) - 6} more" if len(self.skipped) > 6 else ""
            parts.append(f"skipped {len(self.skipped)}: {shown}{more}")
        return "snip.convert: " + ", ".join(parts)


def layer_seed(name: str) -> int:
    """The stochastic-rounding seed of the layer called ``name`` (CRC-32 of the name)."""
    return zlib.crc32(name.encode("utf-8"))


def qlinear_layers(model: nn.Module) -> list[tuple[str, QLinear]]:
    """``(name, module)`` for every ``QLinear`` in ``model``, in module order."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, QLinear)]


def plain_forward(model: nn.Module) -> bool:
    """Whether every enabled ``QLinear`` of ``model`` runs its forward as a plain fp32
    ``F.linear``: an identity fprop format and fp32 GEMMs on its weight's device (not
    :func:`~snip.nn.gemm.bf16_operands`: ``Accum.FP32``, or ``AUTO`` where bf16 GEMMs are not
    native).  Outside autocast such a model's forward is the one :func:`disabled` runs, fp32
    ``F.linear`` of the same operands (tests check the bits on snip's models); a model with no
    ``QLinear`` is plain too."""
    return all(not m.enabled or (m.specs.fprop.is_identity and not bf16_operands(m.accum, m.weight))
               for _, m in qlinear_layers(model))


def bf16_gemms_idle(model: nn.Module) -> bool:
    """Whether ``accum="auto"`` would run some of ``model``'s quantized GEMMs in bf16 that now
    run in fp32: an enabled ``QLinear`` that quantizes at least one of its three GEMMs, with fp32
    GEMMs on a device that multiplies bf16 natively (:func:`~snip.nn.gemm.bf16_gemm_native`).
    ``snip train`` says so when it starts (RESULTS §7an: on such a CPU every preset's step is
    then within issue 21's bounds at 1 thread)."""
    return any(m.enabled and not bf16_operands(m.accum, m.weight)
               and bf16_operands(Accum.AUTO, m.weight)
               and any(not m.specs.get(g).is_identity for g in Gemm)
               for _, m in qlinear_layers(model))


def is_linear_like(module: nn.Module) -> bool:
    """A module that computes a matrix product with its own weight: ``nn.Linear`` and its
    subclasses, HF ``Conv1D``, and anything else whose class name says ``Linear``."""
    if isinstance(module, nn.Linear) or is_conv1d(module):
        return True
    return "Linear" in type(module).__name__ and isinstance(getattr(module, "weight", None),
                                                           torch.Tensor)


def _unsupported_reason(model: nn.Module, name: str, module: nn.Module) -> str | None:
    """Why a linear-like module cannot become a QLinear (``None``: it can)."""
    if is_conv1d(module):
        return None
    if not isinstance(module, nn.Linear):
        return (f"unsupported type {type(module).__module__}.{type(module).__name__} "
                "(snip converts nn.Linear and transformers' Conv1D)")
    parent_name, _, child = name.rpartition(".")
    if name and isinstance(model.get_submodule(parent_name), nn.MultiheadAttention):
        return "inside nn.MultiheadAttention, which reads its weight without calling forward"
    return None


def _convertible(model: nn.Module) -> dict[str, nn.Module]:
    return {n: m for n, m in model.named_modules()
            if is_linear_like(m) and _unsupported_reason(model, n, m) is None}


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name), child, module)


def _paths(model: nn.Module) -> dict[int, list[str]]:
    """Every name of each submodule (by ``id``), in module order: a layer used in two places
    (``nn.Sequential(lin, act, lin)``) has two, which ``named_modules`` lists only once."""
    paths: dict[int, list[str]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        paths.setdefault(id(module), []).append(name)
    return paths


def _resolve(model: nn.Module, what: PlanOrPreset) -> Callable[[str], GemmSpecs | None]:
    """A lookup ``name -> GemmSpecs`` (``None``: do not convert) for ``what``."""
    if isinstance(what, GemmSpecs | QuantSpec | str):
        specs = as_gemm_specs(what)  # an unknown preset raises here, listing the valid ones
        return lambda name: specs
    if isinstance(what, ResolvesToSpecs):
        mapping = {n: as_gemm_specs(s) for n, s in what.resolve(model).items()}
        _check_names(model, mapping, allow_linear=True)
        return mapping.get
    raise TypeError("convert expects a preset name, QuantSpec, GemmSpecs or an object with "
                    f"resolve(model) -> Mapping[str, GemmSpecs]; got {type(what).__name__}")


def _check_names(model: nn.Module, names: Mapping[str, object] | list[str], *,
                 allow_linear: bool) -> None:
    if allow_linear:
        known = set(_convertible(model))
    else:
        known = {n for n, _ in qlinear_layers(model)}
    unknown = [n for n in names if n not in known]
    if unknown:
        what = "linear" if allow_linear else "QLinear"
        sample = ", ".join(sorted(known)[:8]) + (", ..." if len(known) > 8 else "")
        raise UserError(f"no {what} layer named {', '.join(map(repr, unknown))} in the model; "
                        f"known {what} layers: {sample or '(none)'}")


def _skip_reason(model: nn.Module, name: str, module: nn.Module, skip_names: tuple[str, ...],
                 filter_fn: FilterFn | None) -> str | None:
    unsupported = _unsupported_reason(model, name, module)
    if unsupported is not None:
        return unsupported
    if name.rpartition(".")[2] in skip_names:
        return SKIP_NAME
    if filter_fn is not None and not filter_fn(module, name):
        return FILTERED
    return None


def _wrap(name: str, module: nn.Module, specs: GemmSpecs, save: SaveMode,
          accum: Accum) -> QLinear:
    if is_conv1d(module):
        return QConv1D.from_conv1d(module, specs, seed=layer_seed(name), save=save, accum=accum)
    return QLinear.from_linear(module, specs, seed=layer_seed(name), save=save, accum=accum)


def convert(model: nn.Module, plan_or_preset: PlanOrPreset, *,
            filter_fn: FilterFn | None = None, skip_names: tuple[str, ...] = DEFAULT_SKIP_NAMES,
            strict: bool = False, save: SaveMode | str | None = None,
            accum: Accum | str | None = None, gemm: str | None = None) -> nn.Module:
    """Replace eligible linear layers by ``QLinear`` in place and return ``model``.

    Eligible: every ``nn.Linear`` and Hugging Face ``Conv1D`` (GPT-2) except those whose last
    name component is in ``skip_names``, those ``filter_fn(module, fqn)`` rejects (torchao's
    ``module_filter_fn`` order) and, for a plan, those it does not name.  Layers that are already
    ``QLinear`` get the new specs, and ``save``, ``accum`` and ``gemm`` where given (not given,
    each keeps its own; new layers get ``"hp"``, ``"fp32"`` and emulated GEMMs).  What was
    converted and skipped is logged (logger ``snip.nn.convert``, level INFO) and stored as
    ``model.snip_conversion`` (a :class:`Conversion`).

    Converting nothing is a ``ValueError`` (training would silently run in full precision), as is,
    with ``strict=True``, any linear-like module left unconverted for a reason other than
    ``skip_names``, ``filter_fn`` or the plan (an unsupported class, ``nn.MultiheadAttention``'s
    ``out_proj``).  If ``model`` itself is a linear layer it cannot be replaced in place: the new
    ``QLinear`` is returned instead.  ``gemm`` (``"emulated"`` / ``"native"``, see
    :meth:`QLinear.set_gemm`) defaults to the plan's ``gemm`` for a plan, else emulated.
    """
    lookup = _resolve(model, plan_or_preset)
    gemm = gemm if gemm is not None else getattr(plan_or_preset, "gemm", None)
    new_save = as_save_mode(SaveMode.HP if save is None else save)
    new_accum = as_accum(Accum.FP32 if accum is None else accum)
    todo: list[tuple[str, nn.Module, GemmSpecs]] = []
    skipped: list[Skipped] = []
    for name, module in model.named_modules():
        if not is_linear_like(module):
            continue
        reason = _skip_reason(model, name, module, skip_names, filter_fn)
        specs = lookup(name) if reason is None else None
        if reason is None and specs is None:
            reason = NOT_IN_PLAN
        if reason is not None:
            skipped.append(Skipped(name, type(module).__name__, reason))
        else:
            todo.append((name, module, specs))
    report = Conversion(
        converted=tuple((n, type(m).__name__) for n, m, _ in todo if not isinstance(m, QLinear)),
        updated=tuple(n for n, m, _ in todo if isinstance(m, QLinear)), skipped=tuple(skipped))
    _check_report(model, report, strict)
    log.info("%s", report)
    paths = _paths(model)  # a shared layer is one QLinear, under its first name, at every use
    for name, module, specs in todo:
        if isinstance(module, QLinear):
            module.set_specs(specs)
            if save is not None:
                module.save = new_save
            if accum is not None:
                module.accum = new_accum
            if gemm is not None:
                module.set_gemm(gemm)
            continue
        q = _wrap(name, module, specs, new_save, new_accum)
        if gemm is not None:
            q.set_gemm(gemm)
        if not name:
            model = q
        else:
            for path in paths[id(module)]:  # every use of a shared layer
                _set_submodule(model, path, q)
    model.snip_conversion = report
    return model


def _check_report(model: nn.Module, report: Conversion, strict: bool) -> None:
    model_name = type(model).__name__
    if not report.names:
        found = len(report.skipped)
        example = {s.reason: s.name or "(root)" for s in reversed(report.skipped)}
        why = Counter(s.reason for s in report.skipped)
        detail = "; ".join(f"{n} x {reason} (e.g. {example[reason]})"
                           for reason, n in why.most_common())
        raise UserError(
            f"snip.convert converted no layer of {model_name}, so training would run in full "
            f"precision: {found} linear-like module{'s' * (found != 1)} found"
            + (f", all skipped: {detail}" if found else "")
            + "; check skip_names / filter_fn / the plan")
    if strict and report.unsupported:
        bad = "; ".join(f"{s.name} [{s.kind}]: {s.reason}" for s in report.unsupported[:4])
        raise UserError(f"snip.convert(strict=True): {len(report.unsupported)} linear-like "
                         f"module(s) of {model_name} left unconverted: {bad}")


def unconvert(model: nn.Module) -> nn.Module:
    """Replace every ``QLinear`` by the plain layer it wrapped (``nn.Linear`` or ``Conv1D``),
    sharing its Parameters."""
    if isinstance(model, QLinear):
        return model.to_linear()
    plain: dict[int, nn.Module] = {}  # a shared QLinear becomes one shared layer again
    for name, module in list(model.named_modules(remove_duplicate=False)):
        if isinstance(module, QLinear) and name:
            _set_submodule(model, name, plain.setdefault(id(module), module.to_linear()))
    return model


@contextmanager
def disabled(model: nn.Module) -> Iterator[nn.Module]:
    """Run every ``QLinear`` of ``model`` as plain ``F.linear`` inside the block.

    Each layer's previous ``enabled`` flag is restored on exit, also when the block raises.
    """
    layers = [m for _, m in qlinear_layers(model)]
    before = [m.enabled for m in layers]
    try:
        for m in layers:
            m.enabled = False
        yield model
    finally:
        for m, flag in zip(layers, before, strict=True):
            m.enabled = flag
