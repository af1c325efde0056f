"""Session 13's pre-registered analysis (PLAN.md): placed over unplaced stochastic calls, after
minus before, over 4 process pairs.  Usage: python paired.py (from anywhere)."""

import json
import math
import statistics
from pathlib import Path

HERE = Path(__file__).parent
T95 = {3: 3.182}  # t quantile 0.975 by degrees of freedom


def geomean(vs: list[float]) -> float:
    return math.exp(statistics.mean(math.log(v) for v in vs))


def summary(run: dict, preset: str | None = None) -> float:
    return geomean([r["vs_unplaced"] for name, r in run["calls"].items()
                    if "vs_unplaced" in r and (preset is None or name.split()[0] == preset)])


def interval(d: list[float]) -> str:
    m = statistics.mean(d)
    h = T95[len(d) - 1] * statistics.stdev(d) / math.sqrt(len(d))
    return f"{m:+.3f} [{m - h:+.3f}, {m + h:+.3f}] (n = {len(d)})"


def main() -> None:
    runs = {(arm, i): json.loads((HERE / f"{arm}_{i}.json").read_text())
            for arm in ("before", "after") for i in range(1, 5)}
    presets = sorted({n.split()[0] for n in runs[("after", 1)]["calls"]})
    for label, preset in [("all 70 stochastic cases", None)] + [(p, p) for p in presets]:
        b = [summary(runs[("before", i)], preset) for i in range(1, 5)]
        a = [summary(runs[("after", i)], preset) for i in range(1, 5)]
        d = [x - y for x, y in zip(a, b, strict=True)]
        print(f"{label:24s} before {statistics.mean(b):.3f}  after {statistics.mean(a):.3f}  "
              f"after - before {interval(d)}")


if __name__ == "__main__":
    main()
