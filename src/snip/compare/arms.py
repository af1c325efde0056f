"""Arms of a comparison: what each one trains with, parsed from ``--arm`` strings.

    bf16                              a preset on every GEMM (label: the preset)
    fp4=preset:fp4_e2m1_tile128       the same with a label of your choice
    plan:plans/mixed.json             a plan file (label: the file's stem), or LABEL=plan:FILE
    snip@0.75                         SNIP (the ILP) at an FP4-FLOP budget of 0.75, re-planning
                                      every ``precision.every`` steps of the base's config
    snip@0.75/every:100               ... re-planning every 100 steps (the adaptive arm)
    snip@0.75/once                    ... planning once, at the branch point (plan-once)
    snip@0.875/sum                    SNIP with the paper's 1:1 objective (``precision.
                                      normalization sum``); combines: snip@0.875/sum/every:100
    layer_type@0.75                   a baseline at the same budget (uniform, layer_id,
                                      layer_type, layer_id_rev, layer_type_rev, min_rel_err,
                                      random, oracle)
    random@0.75x8                     8 fixed random plans (seeds 0..7), labels random@0.75#k
    random@0.75x4/unit                4 random plans per unit, seeded by (unit, k), labels
                                      random@0.75/unit#k
    random_top@0.75:1                 SNIP's top-1 unit kept high, the rest filled in random
                                      order at the matched FP4 fraction, seeded per unit
                                      (``/fixed``: seed 0 in every unit)

Modifiers after ``/`` (any order, each once): ``every:N`` or ``once`` (re-plan cadence),
``sum`` (the paper's objective), ``unit`` / ``fixed`` (how random orders are seeded).  They are
part of the default label, so ``snip@0.75/every:100`` and ``snip@0.75/once`` are two arms of one
sweep; run directories spell ``/`` as ``+`` and ``:`` as ``-`` (:attr:`Arm.dirname`).

**Seeds per unit.**  A fixed draw ``k`` uses plan seed ``k`` in every unit, so an interval over
units conditions on the K plans drawn (the review of RESULTS §3c found 8 fixed draws that kept
the critical layer high far more often than the population does).  A unit-seeded draw uses
:func:`unit_seed` ``(unit, k)`` -- a different plan in every unit -- so the interval over units
includes the draw-to-draw variance: it estimates "a random plan", not "these K plans".

An arm becomes config overrides of the branch it trains (`Arm.overrides`); adaptive arms plan at
the branch point (``precision.warmup 0``).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from snip.errors import UserError

SNIP_METHOD = "ilp"
_ADAPTIVE = re.compile(r"^(?P<method>[a-z_]+)@(?P<budget>[0-9.]+)(?:x(?P<draws>[0-9]+))?"
                       r"(?::(?P<top>[0-9]+))?(?P<mods>(?:/[a-z]+(?::[0-9]+)?)*)$")
ONCE = 1_000_000_000  # precision.every of a plan-once arm: longer than any branch
RANDOM_ORDERS = ("random", "random_top")
_LABEL = re.compile(r"^[A-Za-z0-9_.@#+:/-]+$")  # what default labels use, too


class Kind(enum.Enum):
    PRESET = "preset"
    PLAN = "plan"
    ADAPTIVE = "adaptive"


@dataclass(frozen=True, kw_only=True)
class Arm:
    """One arm: a label and the precision it trains with."""

    label: str
    kind: Kind
    preset: str = ""
    plan: str = ""
    method: str = ""
    budget: float = 0.0
    draw: int = -1  # random-plan seed of a family of draws (-1: not one of a family)
    every: int = -1  # re-plan cadence: -1 the base's precision.every, 0 once, N every N steps
    per_unit: bool = False  # random orders seeded by (unit, draw) instead of the draw alone
    normalization: str = ""  # precision.normalization ("": the default, nats)
    top: int = 0  # random_top: SNIP's most sensitive units kept high

    @property
    def dirname(self) -> str:
        """The label as a directory name (``/`` -> ``+``, ``:`` -> ``-``)."""
        return self.label.replace("/", "+").replace(":", "-")

    def seed(self, unit: tuple[int, int]) -> int:
        """The plan seed of this arm in ``unit`` (module docstring)."""
        k = max(self.draw, 0)
        return unit_seed(unit, k) if self.per_unit else k

    @property
    def family(self) -> str | None:
        """The label shared by the draws of ``random@rxK`` (None for a single arm)."""
        return self.label.split("#")[0] if self.draw >= 0 else None

    def overrides(self, unit: tuple[int, int] = (0, 0)) -> dict[str, Any]:
        """Config overrides that give a branch of ``unit`` this arm's precision."""
        if self.kind is Kind.PRESET:
            return {"precision.mode": "fixed", "precision.preset": self.preset,
                    "precision.plan": ""}
        if self.kind is Kind.PLAN:
            return {"precision.mode": "fixed", "precision.plan": self.plan,
                    "precision.preset": ""}
        out: dict[str, Any] = {"precision.mode": "adaptive", "precision.method": self.method,
                               "precision.budget": self.budget, "precision.warmup": 0,
                               "precision.plan_seed": self.seed(unit)}
        if self.every >= 0:
            out["precision.every"] = self.every or ONCE
        if self.normalization:
            out["precision.normalization"] = self.normalization
        if self.top:
            out["precision.keep_top"] = self.top
        return out

    def to_dict(self) -> dict[str, Any]:
        d = {"label": self.label, "kind": self.kind.value, "preset": self.preset,
             "plan": self.plan, "method": self.method, "budget": self.budget, "draw": self.draw}
        # the newer fields only where set: definitions written before them compare equal
        extra = {"every": (self.every, -1), "per_unit": (self.per_unit, False),
                 "normalization": (self.normalization, ""), "top": (self.top, 0)}
        return d | {k: v for k, (v, default) in extra.items() if v != default}


def unit_seed(unit: tuple[int, int], k: int) -> int:
    """The plan seed of draw ``k`` in unit ``(base, order)``: a 32-bit hash of the three
    (`numpy.random.SeedSequence`), so units and draws never share a random order by design."""
    import numpy as np

    return int(np.random.SeedSequence((unit[0], unit[1], k)).generate_state(1)[0])


def _methods() -> tuple[str, ...]:
    from snip.planner import Method

    return tuple(m.value for m in Method)


def parse_arm(text: str) -> list[Arm]:
    """The arm(s) of one ``--arm`` value (several for ``xK``); `UserError` on bad syntax."""
    label, sep, spec = text.partition("=")
    if not sep:
        label, spec = "", text
    if label and not _LABEL.match(label):
        raise UserError(f"--arm {text!r}: the label {label!r} may hold only letters, digits "
                        "and . _ @ # + - : /")
    if spec.startswith("preset:") or (not spec.startswith("plan:") and "@" not in spec):
        return [_preset_arm(label, spec.removeprefix("preset:"), text)]
    if spec.startswith("plan:"):
        path = Path(spec.removeprefix("plan:"))
        if not path.is_file():
            raise UserError(f"--arm {text!r}: plan file {str(path)!r} not found")
        return [Arm(label=label or path.stem, kind=Kind.PLAN, plan=str(path.resolve()))]
    return _adaptive_arms(label, spec, text)


def _preset_arm(label: str, preset: str, text: str) -> Arm:
    from snip.formats import PRESETS

    if preset not in PRESETS:
        raise UserError(f"--arm {text!r}: {preset!r} is not a preset, a plan:FILE or "
                        f"METHOD@BUDGET; presets: {', '.join(sorted(PRESETS))}")
    return Arm(label=label or preset, kind=Kind.PRESET, preset=preset)


def _adaptive_arms(label: str, spec: str, text: str) -> list[Arm]:
    m = _ADAPTIVE.match(spec)
    if not m:
        raise UserError(f"--arm {text!r}: expected PRESET, LABEL=preset:PRESET, plan:FILE, "
                        "METHOD@BUDGET[/MODIFIER...], random@BUDGETxK or "
                        "random_top@BUDGET:M")
    method = SNIP_METHOD if m["method"] == "snip" else m["method"]
    if method not in _methods():
        raise UserError(f"--arm {text!r}: unknown method {m['method']!r}; valid: snip, "
                        f"{', '.join(x for x in _methods() if x != SNIP_METHOD)}")
    try:
        budget = float(m["budget"])
    except ValueError:
        raise UserError(f"--arm {text!r}: budget {m['budget']!r} is not a number") from None
    if not 0 <= budget <= 1:
        raise UserError(f"--arm {text!r}: the budget is an FP4-FLOP fraction in [0, 1]")
    if (m["top"] is None) != (method != "random_top") or (m["top"] is not None
                                                          and int(m["top"]) < 1):
        raise UserError(f"--arm {text!r}: :M (M >= 1 units kept high) belongs to "
                        "random_top@BUDGET:M, and random_top needs it")
    fields = _modifiers(m["mods"], method, text)
    if method == "random_top":
        fields.setdefault("per_unit", True)
    name = label or spec
    if m["draws"] is None:
        return [Arm(label=name, kind=Kind.ADAPTIVE, method=method, budget=budget,
                    top=int(m["top"] or 0), **fields)]
    draws = int(m["draws"])
    if method != "random" or draws < 1:
        raise UserError(f"--arm {text!r}: xK (K >= 1 fixed draws) applies to random@BUDGET only")
    family = label or f"{m['method']}@{m['budget']}{m['mods']}"
    return [Arm(label=f"{family}#{k}", kind=Kind.ADAPTIVE, method=method, budget=budget,
                draw=k, **fields) for k in range(draws)]


def _modifiers(text: str, method: str, arm: str) -> dict[str, Any]:
    """The ``/...`` modifiers of an adaptive arm as `Arm` fields (module docstring)."""
    out: dict[str, Any] = {}
    for mod in filter(None, text.split("/")):
        key, _, value = mod.partition(":")
        if key == "every" and value:
            field, v = "every", int(value)
            if v < 1:
                raise UserError(f"--arm {arm!r}: every:N needs N >= 1")
        elif key == "once" and not value:
            field, v = "every", 0
        elif key == "sum" and not value:
            field, v = "normalization", "sum"
        elif key in ("unit", "fixed") and not value:
            if method not in RANDOM_ORDERS:
                raise UserError(f"--arm {arm!r}: /{key} seeds random orders; {method} has none")
            field, v = "per_unit", key == "unit"
        else:
            raise UserError(f"--arm {arm!r}: unknown modifier /{mod}; valid: /every:N, /once, "
                            "/sum, /unit, /fixed")
        if field in out:
            raise UserError(f"--arm {arm!r}: two modifiers set the same thing ({field})")
        out[field] = v
    return out


def parse_arms(texts: list[str]) -> list[Arm]:
    """All arms of the ``--arm`` values; labels, and the run directories they name, must be
    unique."""
    arms = [a for t in texts for a in parse_arm(t)]
    seen: dict[str, str] = {}
    for a in arms:
        if a.label in seen.values():
            raise UserError(f"two arms are labelled {a.label!r}; name one with LABEL=...")
        if a.dirname in seen:
            raise UserError(f"arms {seen[a.dirname]!r} and {a.label!r} would share the run "
                            f"directory {a.dirname!r}; rename one with LABEL=...")
        seen[a.dirname] = a.label
    if not arms:
        raise UserError("give at least one --arm")
    return arms
