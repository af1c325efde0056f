"""``PrecisionPlan``: which format each GEMM of each linear layer uses.

A plan is the planner's output and ``snip.convert``'s input.  It is a small, human-editable JSON
file (schema version 1)::

    {"version": 1,
     "default": {"fprop": "bf16", "dgrad": "bf16", "wgrad": "bf16"},
     "layers": {"layers.0.attention.wq": {"fprop": "nvfp4", "dgrad": "mxfp8_e4m3", "wgrad": ...},
                "re:layers\\.[0-9]+\\.feed_forward\\..*": {...}},
     "meta": {"budget": {"fp4_flop_fraction": 0.75}, "step": 1200}}

Keys of ``layers`` are fully qualified module names, or regexes prefixed ``re:`` that must match
the *whole* name (``re.fullmatch``).  Values name presets of :data:`snip.formats.PRESETS`.

Resolution (:meth:`PrecisionPlan.resolve`) turns a plan into a concrete table
``{layer name: GemmSpecs}`` for one model:

1. an exact name wins;
2. otherwise the *first* regex in file order that matches (later regexes are fallbacks, so write
   specific patterns before broad ones);
3. otherwise ``default``.

Only quantizable layers get a row: every ``nn.Linear`` except the LM head (last name component
``output`` or ``lm_head``), which stays in high precision unless the plan names it exactly --
regexes and the default never reach it.  A key that matches no linear layer is an error naming
it, with close names suggested: a typo must never silently leave a layer in the default format.

An optional top-level ``"gemm": "native"`` (default ``"emulated"``, then not written) asks
:func:`snip.convert` to run the tensor/row-scaled FP8 GEMMs through ``torch._scaled_mm``
(:mod:`snip.nn.native`); it travels with the plan into ``snip train --precision.plan``.

Plans store preset *names*, so they are cheap to build, compare and diff; ``resolve`` is where
names become :class:`~snip.nn.GemmSpecs`.  :meth:`PrecisionPlan.apply` switches an already
converted model to a new plan between steps (weights and optimizer state untouched).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from torch import nn

from snip import atomic, jsonfile
from snip.errors import UserError
from snip.formats import PRESETS, QuantSpec, get_spec
from snip.nn import qlinear_layers
from snip.nn.specs import GEMM_NAMES, Gemm, GemmImpl, GemmSpecs, as_gemm_impl
from snip.plan import cost
from snip.plan.profiles import ThroughputProfile

PLAN_VERSION = 1
REGEX_PREFIX = "re:"
DEFAULT_KEY = "default"

Names = dict[str, str]  # {"fprop": preset, "dgrad": preset, "wgrad": preset}
EntryLike = GemmSpecs | Mapping[str, "QuantSpec | str"] | QuantSpec | str


class PlanChange(NamedTuple):
    """One GEMM whose format differs between two plans (``None``: entry absent)."""

    layer: str
    gemm: str
    old: str | None
    new: str | None


# --------------------------------------------------------------------------------------------
# Validation of one entry
# --------------------------------------------------------------------------------------------

def _preset_name(spec: QuantSpec | str, entry: str, gemm: str) -> str:
    if isinstance(spec, QuantSpec):
        if PRESETS.get(spec.name) != spec:
            raise UserError(f"plan entry '{entry}', {gemm}: spec {spec.name!r} is not a preset; "
                            f"plans store preset names ({', '.join(PRESETS)})")
        return spec.name
    if not isinstance(spec, str) or spec.lower() not in PRESETS:
        raise UserError(f"plan entry '{entry}', {gemm}: unknown preset {spec!r}; valid presets: "
                        f"{', '.join(PRESETS)}")
    return get_spec(spec).name


def _entry_names(value: EntryLike, entry: str, *, strict: bool = True) -> Names:
    """Normalize one entry to ``{"fprop", "dgrad", "wgrad"} -> preset name``.

    ``strict`` (file input) demands the three-key object; the Python constructors also accept a
    ``GemmSpecs`` or a single preset for all three GEMMs.
    """
    if isinstance(value, GemmSpecs):
        value = value.names()
    elif not strict and isinstance(value, str | QuantSpec):
        value = dict.fromkeys(GEMM_NAMES, value)
    if not isinstance(value, Mapping):
        raise UserError(f"plan entry '{entry}' must be an object with keys "
                        f"{', '.join(GEMM_NAMES)}; got {value!r}")
    unknown = [k for k in value if k not in GEMM_NAMES]
    if unknown:
        raise UserError(f"plan entry '{entry}' has unknown key {unknown[0]!r}; "
                        f"expected exactly {', '.join(GEMM_NAMES)}")
    missing = [g for g in GEMM_NAMES if g not in value]
    if missing:
        raise UserError(f"plan entry '{entry}' is missing GEMM key {missing[0]!r}; every entry "
                        f"needs {', '.join(GEMM_NAMES)}")
    return {g: _preset_name(value[g], entry, g) for g in GEMM_NAMES}


def _check_key(key: object) -> None:
    if not isinstance(key, str) or not key or key == REGEX_PREFIX:
        raise UserError(f"plan layer key {key!r} must be a module name or 're:<regex>'")
    if key.startswith(REGEX_PREFIX):
        try:
            re.compile(key[len(REGEX_PREFIX):])
        except re.error as e:
            raise UserError(f"plan entry '{key}' is not a valid regex: {e}") from None


def _check_meta(meta: object) -> dict:
    if not isinstance(meta, Mapping):
        raise UserError(f"plan meta must be a JSON object (dict), got {type(meta).__name__}")
    try:
        json.dumps(meta)
    except (TypeError, ValueError) as e:
        raise UserError(f"plan meta must be JSON-serializable: {e}") from None
    return dict(meta)


# --------------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class PrecisionPlan:
    """Default formats, per-layer overrides (names or ``re:`` regexes, ordered) and free meta."""

    default: Names
    layers: dict[str, Names] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    gemm: GemmImpl = GemmImpl.EMULATED  # how converted layers run their FP8 GEMMs

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "gemm", as_gemm_impl(self.gemm))
        except UserError as e:
            raise UserError(f"plan gemm: {e}") from None
        object.__setattr__(self, "default", _entry_names(self.default, DEFAULT_KEY, strict=False))
        if not isinstance(self.layers, Mapping):
            raise UserError(f"plan layers must be an object, got {type(self.layers).__name__}")
        layers = {}
        for key, value in self.layers.items():
            _check_key(key)
            layers[key] = _entry_names(value, key, strict=False)
        object.__setattr__(self, "layers", layers)
        object.__setattr__(self, "meta", _check_meta(self.meta))

    # -- construction ------------------------------------------------------------------------

    @classmethod
    def uniform(cls, preset: QuantSpec | str, meta: Mapping | None = None) -> PrecisionPlan:
        """Every quantizable layer, every GEMM in ``preset``."""
        return cls(default=dict.fromkeys(GEMM_NAMES, preset), meta=dict(meta or {}))

    @classmethod
    def from_table(cls, table: Mapping[str, EntryLike], default: EntryLike = "bf16",
                   meta: Mapping | None = None) -> PrecisionPlan:
        """A plan naming each layer of ``table`` (``GemmSpecs``, name dicts or one preset)."""
        return cls(default=default, layers=dict(table), meta=dict(meta or {}))

    @classmethod
    def from_json(cls, source: str | Path | Mapping) -> PrecisionPlan:
        """Read a plan from a file path, a JSON string or an already parsed dict."""
        if isinstance(source, Mapping):
            return cls.from_dict(source)
        if isinstance(source, str) and source.lstrip()[:1] in ("{", "["):
            return cls.from_dict(jsonfile.loads(source, "plan JSON string"))
        return cls.from_dict(jsonfile.read_object(source, "plan file"))

    @classmethod
    def from_dict(cls, data: Mapping) -> PrecisionPlan:
        if not isinstance(data, Mapping):
            raise UserError(f"a plan must be a JSON object, got {type(data).__name__}")
        version = data.get("version")
        if type(version) is not int or version != PLAN_VERSION:
            raise UserError(f"unsupported plan version {version!r}; this snip reads "
                            f'"version": {PLAN_VERSION}')
        unknown = [k for k in data if k not in ("version", "default", "layers", "meta", "gemm")]
        if unknown:
            raise UserError(f"unknown plan key {unknown[0]!r}; valid keys: version, default, "
                            f"layers, meta, gemm")
        gemm = data.get("gemm", GemmImpl.EMULATED.value)
        if not isinstance(gemm, str):
            raise UserError(f'plan gemm must be "emulated" or "native", got {gemm!r}')
        if DEFAULT_KEY not in data:
            raise UserError('plan has no "default" entry; add e.g. {"fprop": "bf16", '
                            '"dgrad": "bf16", "wgrad": "bf16"}')
        layers = data.get("layers", {})
        if not isinstance(layers, Mapping):
            raise UserError(f"plan layers must be an object, got {type(layers).__name__}")
        return cls(default=_entry_names(data[DEFAULT_KEY], DEFAULT_KEY),
                   layers={k: _entry_names(v, k) for k, v in layers.items()},
                   meta=data.get("meta", {}), gemm=gemm)

    def to_dict(self) -> dict:
        out = {"version": PLAN_VERSION, "default": dict(self.default),
               "layers": {k: dict(v) for k, v in self.layers.items()}, "meta": dict(self.meta)}
        if self.gemm is not GemmImpl.EMULATED:  # files of emulated plans stay as they were
            out["gemm"] = self.gemm.value
        return out

    def to_json(self, path: str | Path | None = None) -> str:
        """The plan as JSON text (key order kept); also written to ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=2)
        if path is not None:
            atomic.write_text(path, text + "\n")  # whole or not at all; one-line errors
        return text

    def with_meta(self, **meta: Any) -> PrecisionPlan:
        """A copy with ``meta`` entries added or replaced."""
        return dataclasses.replace(self, meta={**self.meta, **meta})

    # -- resolution --------------------------------------------------------------------------

    def resolve(self, model: nn.Module | None = None,
                linear_names: Iterable[str] | None = None) -> dict[str, GemmSpecs]:
        """``{layer: GemmSpecs}`` for every quantizable linear layer, in module order.

        ``linear_names`` replaces the model's linear layers as the candidate set (e.g. the rows
        of a sensitivity table); one of ``model`` / ``linear_names`` is needed.
        """
        names = _candidate_names(model, linear_names)
        regexes = [(k, re.compile(k[len(REGEX_PREFIX):])) for k in self.layers
                   if k.startswith(REGEX_PREFIX)]
        self._check_keys_match(names, regexes, model)
        cache: dict[tuple[str, ...], GemmSpecs] = {}
        table = {}
        for name in names:
            entry = self._entry_for(name, regexes)
            if entry is not None:
                key = tuple(entry[g] for g in GEMM_NAMES)
                if key not in cache:
                    cache[key] = GemmSpecs(**entry)
                table[name] = cache[key]
        return table

    def _entry_for(self, name: str, regexes: list[tuple[str, re.Pattern]]) -> Names | None:
        if name in self.layers and not name.startswith(REGEX_PREFIX):
            return self.layers[name]
        if cost.is_head(name):
            return None
        for key, pattern in regexes:
            if pattern.fullmatch(name):
                return self.layers[key]
        return self.default

    def _check_keys_match(self, names: list[str], regexes: list[tuple[str, re.Pattern]],
                          model: nn.Module | None) -> None:
        known, patterns = set(names), dict(regexes)
        body = [n for n in names if not cost.is_head(n)]
        for key in self.layers:
            if key in patterns:
                if not any(patterns[key].fullmatch(n) for n in body):
                    raise UserError(_no_match_message(key, key[len(REGEX_PREFIX):], body, model))
            elif key not in known:
                raise UserError(_no_match_message(key, key, names, model))

    def apply(self, model: nn.Module) -> dict[str, GemmSpecs]:
        """Switch a converted model's ``QLinear`` layers to this plan; returns what was set.

        Only formats change: weights, buffers and optimizer state are untouched, so this is safe
        between two optimizer steps.  Converted layers the plan does not govern (an LM head it
        does not name) keep their formats.
        """
        converted = qlinear_layers(model)
        if not converted:
            raise UserError("model has no converted (QLinear) layers; call "
                            "snip.convert(model, plan) first, then plan.apply(model) to switch")
        table = self.resolve(model)
        applied = {}
        for name, module in converted:
            if name in table:
                module.set_specs(table[name])
                applied[name] = table[name]
        return applied

    # -- inspection --------------------------------------------------------------------------

    def diff(self, other: PrecisionPlan, model: nn.Module | None = None) -> list[PlanChange]:
        return diff(self, other, model)

    def summary(self, model: nn.Module, tokens: int = 1,
                profile: ThroughputProfile | str | None = None) -> str:
        """A table layers x GEMMs with FLOP shares and the plan's FP4-FLOP fraction."""
        table = self.resolve(model)
        flops = cost.layer_flops(model, tokens, table)
        total = sum(flops.values()) or 1
        width = max([len("layer"), *map(len, table)])
        fmt_w = max([6, *(len(s.get(g).name) for s in table.values() for g in Gemm)])
        head = f"{'layer':<{width}}  " + "  ".join(f"{g:<{fmt_w}}" for g in GEMM_NAMES) + "  FLOP %"
        lines = [head, "-" * len(head)]
        for name, specs in table.items():
            fmts = "  ".join(f"{specs.get(g).name:<{fmt_w}}" for g in Gemm)
            lines.append(f"{name:<{width}}  {fmts}  {100 * flops[name] / total:6.2f}")
        lines.append("-" * len(head))
        frac = cost.fp4_flop_fraction(table, model, tokens)
        lines.append(f"{len(table)} layers, {sum(flops.values()):.4g} GEMM FLOPs for {tokens} "
                     f"token(s); FP4 FLOP fraction {100 * frac:.1f}%")
        if profile is not None:
            rel = cost.relative_gemm_time(table, model, tokens, profile)
            lines.append(f"relative GEMM time vs all-bf16 ({getattr(profile, 'name', profile)}): "
                         f"{rel:.3f}")
        return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------

def _candidate_names(model: nn.Module | None, linear_names: Iterable[str] | None) -> list[str]:
    if linear_names is not None:
        return list(linear_names)
    if model is None:
        raise UserError("resolve needs a model or linear_names")
    return list(cost.linear_layers(model, include_head=True))


def _no_match_message(key: str, query: str, names: list[str], model: nn.Module | None) -> str:
    what = "regex" if key.startswith(REGEX_PREFIX) else "name"
    msg = f"plan entry '{key}': {what} matches no linear layer of the model"
    if model is not None and what == "name":
        module = dict(model.named_modules()).get(key)
        if module is not None:
            return (f"plan entry '{key}' names a {type(module).__name__}, not a linear layer; "
                    f"name its linear layers or use 're:{re.escape(key)}\\..*'")
    close = difflib.get_close_matches(query, names, n=3, cutoff=0.5)
    if close:
        return f"{msg}; did you mean {', '.join(map(repr, close))}?"
    sample = ", ".join(map(repr, names[:3])) or "(none)"
    hint = ""
    if what == "regex":
        hint = " (regexes must match the whole name and never reach the LM head)"
    return f"{msg}{hint}; layer names look like {sample}"


def _changes(old: Mapping[str, Names], new: Mapping[str, Names]) -> list[PlanChange]:
    """GEMMs whose preset differs between two ``{key: {gemm: name}}`` maps, ``old``'s keys first."""
    changes = []
    for key in [*old, *(k for k in new if k not in old)]:
        for g in GEMM_NAMES:
            o = old[key][g] if key in old else None
            n = new[key][g] if key in new else None
            if o != n:
                changes.append(PlanChange(key, g, o, n))
    return changes


def diff(a: PrecisionPlan, b: PrecisionPlan, model: nn.Module | None = None) -> list[PlanChange]:
    """GEMMs whose format changes from ``a`` to ``b``.

    With a model: over the resolved tables (what actually runs; a layer governed by only one
    plan shows ``None`` on the other side).  Without: over the raw entries, ``"default"`` first.
    """
    if model is None:
        return _changes({DEFAULT_KEY: a.default, **a.layers}, {DEFAULT_KEY: b.default, **b.layers})
    return _changes({n: s.names() for n, s in a.resolve(model).items()},
                    {n: s.names() for n, s in b.resolve(model).items()})
