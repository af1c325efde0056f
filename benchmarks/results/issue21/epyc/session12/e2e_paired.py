"""Session 12's pre-registered analysis (PLAN.md): `snip train` end to end against the minimal
loop, before and after the change, from `bench_train_e2e.py --rounds 1` processes run in
alternation (``before_<i>.json``, ``after_<i>.json`` in this folder or the one given).

Per process, ratios of whole-run wall times (same seed, model and batches):
``train_fp32 / loop_fp32`` and ``train_mxfp4 / loop_mxfp4`` (the trainer's own cost, the issue's
1.2x target), ``train_default / loop_plain`` (the default adaptive run against the plain loop),
and two controls the change cannot touch (the loops never place tokens):
``loop_fp32 / loop_plain`` and ``loop_mxfp4 / loop_plain``.

Prints, per ratio: the before and after means, after - before over the pairs with its 95 %
t-interval, and each side's mean with its 95 % t-interval over processes and the verdict
against 1.2 for the two target ratios (inside: the upper end below 1.2; outside: the lower end
above; else unresolved).

    python benchmarks/results/issue21/epyc/session12/e2e_paired.py
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from scipy import stats

RATIOS = {"train_fp32 / loop_fp32": ("train_fp32", "loop_fp32"),
          "train_mxfp4 / loop_mxfp4": ("train_mxfp4", "loop_mxfp4"),
          "train_default / loop_plain": ("train_default", "loop_plain"),
          "loop_fp32 / loop_plain (control)": ("loop_fp32", "loop_plain"),
          "loop_mxfp4 / loop_plain (control)": ("loop_mxfp4", "loop_plain")}
TARGET = 1.2
TARGETED = ("train_fp32 / loop_fp32", "train_mxfp4 / loop_mxfp4")


def ratios(path: Path) -> dict[str, float]:
    s = json.loads(path.read_text())["seconds"]
    return {name: s[a][0] / s[b][0] for name, (a, b) in RATIOS.items()}


def interval(xs: list[float]) -> tuple[float, float, float]:
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, float("nan"), float("nan")
    h = stats.t.ppf(0.975, len(xs) - 1) * statistics.stdev(xs) / len(xs) ** 0.5
    return m, m - h, m + h


def verdict(lo: float, hi: float) -> str:
    return "inside" if hi < TARGET else "outside" if lo > TARGET else "unresolved"


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
    pairs = []
    i = 1
    while (folder / f"before_{i}.json").exists() and (folder / f"after_{i}.json").exists():
        pairs.append((ratios(folder / f"before_{i}.json"), ratios(folder / f"after_{i}.json")))
        i += 1
    print(f"{len(pairs)} pairs from {folder}")
    print(f"{'ratio':36s} {'before':>7s} {'after':>7s}  after - before [95 %]")
    for name in RATIOS:
        b = [p[0][name] for p in pairs]
        a = [p[1][name] for p in pairs]
        d, lo, hi = interval([y - x for x, y in zip(b, a, strict=True)])
        print(f"{name:36s} {statistics.fmean(b):7.3f} {statistics.fmean(a):7.3f}  "
              f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]")
    print(f"\nagainst the {TARGET}x target, mean [95 %] over processes:")
    for name in TARGETED:
        for side, k in (("before", 0), ("after", 1)):
            m, lo, hi = interval([p[k][name] for p in pairs])
            print(f"{name:36s} {side:6s} {m:.3f} [{lo:.3f}, {hi:.3f}] {verdict(lo, hi)}")


if __name__ == "__main__":
    main()
