"""Several runs side by side: repeats grouped, a baseline to subtract, the configuration diff.

* :func:`group_repeats` -- runs that differ only in their seed are *repeats* of one recipe.  Two
  runs are repeats when their configs are equal after removing ``seed`` and ``run.*`` (name,
  directory), or -- without configs -- when their names are equal after removing a seed suffix
  (``_s1``, ``-seed2``, ``.seed3``).  A group reports the mean and the spread (min..max, and the
  sample standard deviation for 3+ runs) of its final numbers.
* :func:`pick_baseline` -- the run (or group) differences are taken against: ``--baseline RUN``
  (a run name or path), else the first run whose precision is bf16, else the first run.
* :func:`config_diff` -- the dotted configuration keys whose values differ between runs; the
  rest is identical and is not repeated in the report.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from snip.errors import UserError
from snip.jsonfile import flatten
from snip.report.runs import RunData

_SEED_SUFFIX = re.compile(r"[-_.]?(s|seed)\d+$", re.IGNORECASE)
_NOT_RECIPE = ("seed", "run.")


@dataclass
class Group:
    """Repeats of one recipe (a single run is a group of one)."""

    name: str
    runs: list[RunData] = field(default_factory=list)

    @property
    def repeated(self) -> bool:
        return len(self.runs) > 1


def recipe_key(run: RunData) -> str:
    """What makes two runs repeats: the config without seed/run keys, else the bare name."""
    if run.config:
        flat = flatten(run.config)
        return repr(sorted((k, repr(v)) for k, v in flat.items()
                           if k != "seed" and not k.startswith("run.")))
    return "name:" + _SEED_SUFFIX.sub("", run.name)


def group_repeats(runs: list[RunData]) -> list[Group]:
    """Runs grouped by recipe, in first-seen order; a group is named by its runs' common name."""
    groups: dict[str, Group] = {}
    for run in runs:
        groups.setdefault(recipe_key(run), Group(name="")).runs.append(run)
    for g in groups.values():
        bare = {_SEED_SUFFIX.sub("", r.name) for r in g.runs}
        g.name = bare.pop() if len(bare) == 1 and g.repeated else "+".join(r.name for r in g.runs)
        if not g.repeated:
            g.name = g.runs[0].name
    return list(groups.values())


def mean_spread(values: list[float | None]) -> tuple[float | None, float | None, float | None]:
    """(mean, min..max half-range, sample std or None) of the non-missing values."""
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return None, None, None
    mean = sum(vals) / len(vals)
    half = (max(vals) - min(vals)) / 2
    std = (math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
           if len(vals) > 2 else None)
    return mean, half, std


def pick_baseline(runs: list[RunData], baseline: str | None, labels: dict[str, str]) -> RunData:
    """The run named (or located at) ``baseline``; default: the first bf16 run, else the first."""
    if baseline is not None:
        for run in runs:
            if baseline in (run.name, str(run.path)) or Path(baseline).resolve() == \
                    run.path.resolve():
                return run
        names = ", ".join(r.name for r in runs)
        raise UserError(f"--baseline {baseline!r} is not one of the runs ({names})")
    for run in runs:
        if labels.get(run.name) == "bf16":
            return run
    return runs[0]


def config_diff(runs: list[RunData]) -> dict[str, list[Any]]:
    """``{dotted key: [value per run]}`` for the keys whose values differ (``run.dir`` omitted)."""
    flats = [flatten(r.config) for r in runs]
    keys = sorted({k for f in flats for k in f} - {"run.dir"})
    return {k: [f.get(k) for f in flats] for k in keys
            if len({repr(f.get(k)) for f in flats}) > 1}
