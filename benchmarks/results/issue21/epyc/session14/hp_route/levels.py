"""Descriptive (not part of a plan's analysis): where the code stands against issue 21's
bounds, from the ``after`` runs of a folder (this one by default).  Per model and arm, the mean
of ``cpu_vs_fp32`` over the runs with its 95 % t-interval (n = runs), and the adaptive step
averaged over a re-plan period (``amortized_vs_fp32``, its statistics cycle included).

    python benchmarks/results/issue21/epyc/session14/hp_route/levels.py [FOLDER]
"""

import json
import sys
from pathlib import Path

from snip.compare.stats import t_interval

HERE = Path(__file__).parent
BOUND = {"tiny-deep": 1.3}  # width 64; 1.15 at every width >= 128


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
    values: dict[tuple[str, str], list[float]] = {}
    for path in sorted(folder.glob("after_*.json")):
        for run in json.loads(path.read_text())["runs"].values():
            for model, m in run["models"].items():
                for arm, v in m["arms"].items():
                    if arm != "fp32":
                        values.setdefault((model, arm), []).append(v["cpu_vs_fp32"])
                values.setdefault((model, "adaptive, over a period"), []).append(
                    m["adaptive"]["amortized_vs_fp32"])
    n = len(next(iter(values.values())))
    print(f"current code ({n} runs), cpu_vs_fp32: mean [95% t-interval] against the bound")
    for (model, arm), v in values.items():
        mean, lo, hi = t_interval(v)
        bound = BOUND.get(model, 1.15)
        where = "inside" if hi < bound else "outside" if lo > bound else "unresolved"
        print(f"{model:10s} {arm:24s} {mean:.3f} [{lo:.3f}, {hi:.3f}]  {where} ({bound})")


if __name__ == "__main__":
    main()
