"""Reading a run directory: config, metric series and the plans applied over time.

Only files are read (``config.toml``, ``metrics.jsonl``, ``plans/step_<N>.json``), never a
model, so a report can be made on any machine from a copied run directory.  Series read from
``metrics.jsonl``: train ``loss``, ``lr``, ``tokens_per_s``, ``fp4_flop_fraction`` and, with a
write-back policy, ``writeback_frozen`` / ``writeback_never_moved``; eval ``val_loss``, ``ppl``;
plan ``plan_changes`` (layers x GEMMs whose format changed at that step).
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from snip.errors import MissingFileError, UserError
from snip.nn.specs import GEMM_NAMES

GEMMS = GEMM_NAMES


@dataclass
class Series:
    steps: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    def add(self, step: int, value: Any) -> None:
        try:
            v = float(value)
        except (TypeError, ValueError):
            return
        self.steps.append(int(step))
        self.values.append(v)

    @property
    def last(self) -> float | None:
        return self.values[-1] if self.values else None


@dataclass
class RunData:
    path: Path
    name: str
    config: dict[str, Any]
    series: dict[str, Series]
    plans: list[tuple[int, dict[str, Any]]]  # (step, plan dict), by step
    events: list[dict[str, Any]]

    def s(self, key: str) -> Series:
        return self.series.get(key, Series())


# metrics.jsonl field -> series name
_SERIES = {("train", "loss"): "loss", ("train", "lr"): "lr",
           ("train", "tokens_per_s"): "tokens_per_s",
           ("train", "fp4_flop_fraction"): "fp4_flop_fraction",
           ("train", "writeback_frozen"): "writeback_frozen",
           ("train", "writeback_never_moved"): "writeback_never_moved",
           ("eval", "val_loss"): "val_loss", ("eval", "ppl"): "ppl",
           ("plan", "changes"): "plan_changes"}


def load_run(path: str | Path) -> RunData:
    """Read a run directory; a missing directory or metrics file is a FileNotFoundError."""
    path = Path(path)
    metrics = path / "metrics.jsonl"
    if not metrics.is_file():
        raise MissingFileError(f"{path} is not a run directory (no metrics.jsonl)")
    events, lines = [], metrics.read_text(errors="replace").splitlines()
    for line in lines:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line of a killed run
        if isinstance(event, dict) and isinstance(event.get("step"), int | float):
            events.append(event)  # anything else is not one of our events
    if lines and not events:
        raise UserError(f"{metrics} holds no snip metrics events (each line must be a JSON "
                        "object with an 'event' and a 'step'); is it a metrics.jsonl?")
    series: dict[str, Series] = {}
    for e in events:
        for (kind, key), name in _SERIES.items():
            if e.get("event") == kind and key in e:
                series.setdefault(name, Series()).add(e["step"], e[key])
    return RunData(path=path, name=path.name, config=_read_config(path), series=series,
                   plans=_read_plans(path), events=events)


def _read_config(path: Path) -> dict[str, Any]:
    f = path / "config.toml"
    if not f.is_file():
        return {}
    try:
        return tomllib.loads(f.read_text())
    except tomllib.TOMLDecodeError:
        return {}


def _read_plans(path: Path) -> list[tuple[int, dict[str, Any]]]:
    plans = []
    for f in (path / "plans").glob("step_*.json"):
        try:
            plan = json.loads(f.read_text())
            step = int(f.stem.split("_", 1)[1])
        except (OSError, ValueError):
            continue
        layers = plan.get("layers", {}) if isinstance(plan, dict) else None
        if isinstance(layers, dict) and isinstance(plan.get("default", {}), dict) and all(
                isinstance(v, dict) for v in layers.values()):  # else not a plan snip wrote
            plans.append((step, plan))
    return sorted(plans, key=lambda p: p[0])


def plan_formats(plan: dict[str, Any], layers: list[str]) -> dict[tuple[str, str], str]:
    """``{(layer, gemm): preset}`` from a saved plan (explicit layer names, as the trainer writes
    them; layers it does not name take the default)."""
    default = plan.get("default", {})
    rows = plan.get("layers", {})
    return {(layer, g): rows.get(layer, default).get(g, default.get(g, "?"))
            for layer in layers for g in GEMMS}


def plan_layers(plans: list[tuple[int, dict[str, Any]]]) -> list[str]:
    """Every explicitly named layer over all plans, in first-seen order."""
    seen: dict[str, None] = {}
    for _, plan in plans:
        for name in plan.get("layers", {}):
            if not name.startswith("re:"):
                seen.setdefault(name, None)
    return list(seen)
