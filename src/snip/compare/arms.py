"""Arms of a comparison: what each one trains with, parsed from ``--arm`` strings.

    bf16                              a preset on every GEMM (label: the preset)
    fp4=preset:fp4_e2m1_tile128       the same with a label of your choice
    plan:plans/mixed.json             a plan file (label: the file's stem), or LABEL=plan:FILE
    snip@0.75                         SNIP (the ILP) re-planning at an FP4-FLOP budget of 0.75
    layer_type@0.75                   a baseline at the same budget (uniform, layer_id,
                                      layer_type, min_rel_err, random, ...)
    random@0.75x8                     8 fixed random plans (seeds 0..7), labels random@0.75#k

An arm becomes config overrides of the branch it trains (`Arm.overrides`); adaptive arms plan at
the branch point (``precision.warmup 0``) and re-plan every ``precision.every`` steps.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from snip.errors import UserError

SNIP_METHOD = "ilp"
_ADAPTIVE = re.compile(r"^(?P<method>[a-z_]+)@(?P<budget>[0-9.]+)(?:x(?P<draws>[0-9]+))?$")
_LABEL = re.compile(r"^[A-Za-z0-9_.@#+-]+$")


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

    @property
    def family(self) -> str | None:
        """The label shared by the draws of ``random@rxK`` (None for a single arm)."""
        return self.label.split("#")[0] if self.draw >= 0 else None

    def overrides(self) -> dict[str, Any]:
        """Config overrides that give a branch this arm's precision."""
        if self.kind is Kind.PRESET:
            return {"precision.mode": "fixed", "precision.preset": self.preset,
                    "precision.plan": ""}
        if self.kind is Kind.PLAN:
            return {"precision.mode": "fixed", "precision.plan": self.plan,
                    "precision.preset": ""}
        return {"precision.mode": "adaptive", "precision.method": self.method,
                "precision.budget": self.budget, "precision.warmup": 0,
                "precision.plan_seed": max(self.draw, 0)}

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "kind": self.kind.value, "preset": self.preset,
                "plan": self.plan, "method": self.method, "budget": self.budget,
                "draw": self.draw}


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
                        "and . _ @ # + -")
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
                        "METHOD@BUDGET or random@BUDGETxK")
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
    name = label or f"{m['method']}@{m['budget']}"
    if m["draws"] is None:
        return [Arm(label=name, kind=Kind.ADAPTIVE, method=method, budget=budget)]
    draws = int(m["draws"])
    if method != "random" or draws < 1:
        raise UserError(f"--arm {text!r}: xK (K >= 1 fixed draws) applies to random@BUDGET only")
    return [Arm(label=f"{name}#{k}", kind=Kind.ADAPTIVE, method=method, budget=budget, draw=k)
            for k in range(draws)]


def parse_arms(texts: list[str]) -> list[Arm]:
    """All arms of the ``--arm`` values; labels must be unique."""
    arms = [a for t in texts for a in parse_arm(t)]
    seen: set[str] = set()
    for a in arms:
        if a.label in seen:
            raise UserError(f"two arms are labelled {a.label!r}; name one with LABEL=...")
        seen.add(a.label)
    if not arms:
        raise UserError("give at least one --arm")
    return arms
