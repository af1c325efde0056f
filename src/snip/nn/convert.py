"""Model conversion: swap ``nn.Linear`` for ``QLinear`` in place, switch formats, swap back.

``convert(model, what)`` walks the module tree and replaces each eligible ``nn.Linear`` by a
:class:`~snip.nn.qlinear.QLinear` that *shares* its Parameters, so optimizer state, ``state_dict``
keys and weight tying are untouched.  ``what`` is a preset name, a ``QuantSpec`` or a
``GemmSpecs`` (every converted layer gets it), or a precision plan: any object with
``resolve(model) -> Mapping[str, GemmSpecs]`` keyed by fully qualified module name, in which case
only the layers it names are converted.

By default the LM head stays in high precision (the NVFP4 recipe and every emulator cited in
``research/landscape.md`` keep embeddings and head out of the low-precision GEMMs): modules whose
last name component is in ``skip_names`` (``output``, ``lm_head``) are left alone, as is anything
``filter_fn(name, module)`` rejects.  Embeddings are ``nn.Embedding``, never converted.

Each layer's stochastic-rounding seed is ``zlib.crc32(name)``: stable across processes and runs
(Python's ``hash`` of a string is salted per process).

Between steps, :func:`apply_specs` changes the formats of already converted layers (what the
adaptive-precision controller does); :func:`disabled` runs a block with every ``QLinear`` as a
plain fp32 ``F.linear`` (reference runs, sensitivity baselines); :func:`unconvert` undoes it all.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Protocol, runtime_checkable

from torch import nn

from snip.errors import UserError
from snip.formats import QuantSpec
from snip.nn.gemm import Accum, SaveMode
from snip.nn.qlinear import QLinear, as_gemm_specs
from snip.nn.specs import GemmSpecs

FilterFn = Callable[[str, nn.Module], bool]
DEFAULT_SKIP_NAMES = ("output", "lm_head")


@runtime_checkable
class ResolvesToSpecs(Protocol):
    """A precision plan: per-layer ``GemmSpecs`` for a given model."""

    def resolve(self, model: nn.Module) -> Mapping[str, GemmSpecs]: ...


PlanOrPreset = str | QuantSpec | GemmSpecs | ResolvesToSpecs


def layer_seed(name: str) -> int:
    """The stochastic-rounding seed of the layer called ``name`` (CRC-32 of the name)."""
    return zlib.crc32(name.encode("utf-8"))


def qlinear_layers(model: nn.Module) -> list[tuple[str, QLinear]]:
    """``(name, module)`` for every ``QLinear`` in ``model``, in module order."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, QLinear)]


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name), child, module)


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
    kind = nn.Linear if allow_linear else QLinear
    known = {n for n, m in model.named_modules() if isinstance(m, kind)}
    unknown = [n for n in names if n not in known]
    if unknown:
        what = "linear" if allow_linear else "QLinear"
        sample = ", ".join(sorted(known)[:8]) + (", ..." if len(known) > 8 else "")
        raise UserError(f"no {what} layer named {', '.join(map(repr, unknown))} in the model; "
                        f"known {what} layers: {sample or '(none)'}")


def _eligible(name: str, module: nn.Module, skip_names: tuple[str, ...],
              filter_fn: FilterFn | None) -> bool:
    if not isinstance(module, nn.Linear) or name.rpartition(".")[2] in skip_names:
        return False
    return filter_fn is None or bool(filter_fn(name, module))


def convert(model: nn.Module, plan_or_preset: PlanOrPreset, filter_fn: FilterFn | None = None,
            *, skip_names: tuple[str, ...] = DEFAULT_SKIP_NAMES,
            save: SaveMode | str = SaveMode.HP, accum: Accum | str = Accum.FP32) -> nn.Module:
    """Replace eligible ``nn.Linear`` modules by ``QLinear`` in place and return ``model``.

    Layers that are already ``QLinear`` get the new specs.  If ``model`` itself is an
    ``nn.Linear`` it cannot be replaced in place: the new ``QLinear`` is returned instead.
    """
    lookup = _resolve(model, plan_or_preset)
    save, accum = SaveMode(save), Accum(accum)
    for name, module in list(model.named_modules()):
        specs = lookup(name) if _eligible(name, module, skip_names, filter_fn) else None
        if specs is None:
            continue
        if isinstance(module, QLinear):
            module.set_specs(specs)
            continue
        q = QLinear.from_linear(module, specs, seed=layer_seed(name), save=save, accum=accum)
        if not name:
            return q
        _set_submodule(model, name, q)
    return model


def unconvert(model: nn.Module) -> nn.Module:
    """Replace every ``QLinear`` by a plain ``nn.Linear`` sharing its Parameters."""
    if isinstance(model, QLinear):
        return model.to_linear()
    for name, module in qlinear_layers(model):
        _set_submodule(model, name, module.to_linear())
    return model


def apply_specs(model: nn.Module, mapping: Mapping[str, GemmSpecs | QuantSpec | str]) -> None:
    """Set the formats of converted layers by name; Parameters and optimizer state untouched.

    Every name must be a ``QLinear`` of ``model`` (checked before anything changes).
    """
    specs = {n: as_gemm_specs(s) for n, s in mapping.items()}
    _check_names(model, specs, allow_linear=False)
    for name, s in specs.items():
        model.get_submodule(name).set_specs(s)


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
