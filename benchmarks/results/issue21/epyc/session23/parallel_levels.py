"""The pre-registered analysis of session 23's runs (``PLAN.md``): per case and preset, the
paired difference ``ratio(2^14) - ratio(adaptive)`` (each ratio to the same round's fp32 step;
per process the median over its rounds), mean and 95 % t-interval over the processes, and each
setting's ratio to fp32 (descriptive).

    PYTHONPATH=src python benchmarks/results/issue21/epyc/session23/parallel_levels.py DIR
"""

import json
import statistics
import sys
from pathlib import Path

from snip.compare.stats import t_interval


def main() -> None:
    runs = [json.loads(p.read_text())["rounds_s"]
            for p in sorted(Path(sys.argv[1]).glob("run_*.json"))]
    keys = [k for k in runs[0] if not k.endswith(" fp32 0")]
    cases = list(dict.fromkeys(k.rsplit(" ", 2)[0] for k in keys))  # "model tokens", in order
    print(f"n = {len(runs)} processes; 2 threads; mean [95% t-interval] over processes of the "
          "per-process median over rounds")
    for case in cases:
        name = case.split(" ", 1)[0]
        bound = 1.3 if name == "tiny-deep" else 1.15
        presets = list(dict.fromkeys(k.rsplit(" ", 2)[1] for k in keys
                                     if k.startswith(case + " ")))
        for p in presets:
            ratio = {s: [statistics.median(a / f for a, f in zip(
                r[f"{case} {p} {s}"], r[f"{case} fp32 0"], strict=True))
                for r in runs] for s in ("adaptive", "16384")}
            d = [statistics.median(
                (a / f) - (b / f) for a, b, f in zip(r[f"{case} {p} 16384"],
                                                     r[f"{case} {p} adaptive"],
                                                     r[f"{case} fp32 0"], strict=True))
                 for r in runs]
            m, lo, hi = t_interval(d)
            verdict = "faster" if hi < 0 else "slower" if lo > 0 else "unresolved"
            cells = "  ".join("{} {:.3f} [{:.3f}, {:.3f}]".format(s, *t_interval(v))
                              for s, v in ratio.items())
            print(f"{case:16s} {p:11s} 2^14 - adaptive {m:+.3f} [{lo:+.3f}, {hi:+.3f}] "
                  f"{verdict:10s} | {cells} (bound {bound})")


if __name__ == "__main__":
    main()
