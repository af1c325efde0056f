"""The pre-registered analysis of PLAN.md here: per model and arm, after - before of the mean
``cpu_vs_fp32`` (after: this folder's runs; before: ``../targets_zen4``'s, same models), with a
Welch 95 % interval over the two samples of independent runs; lower / higher / unresolved.

    PYTHONPATH=src python benchmarks/results/issue21/epyc/session19/bf16_cols/compare.py
"""

import json
import statistics
from pathlib import Path

from scipy import stats

HERE = Path(__file__).parent
BEFORE = HERE.parent / "targets_zen4"
PRIMARY = ("fp8_e4m3_tile128", "mxfp8_e4m3", "mxfp4", "nvfp4", "fp4_e2m1_tile128")


def runs(folder: Path) -> list[dict]:
    out = []
    for p in sorted(folder.glob("run_*.json")):
        models = json.loads(p.read_text())["runs"]["1"]["models"]
        out.append({(m, a): v["cpu_vs_fp32"] for m, mv in models.items()
                    for a, v in mv["arms"].items()})
    return out


def welch(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """mean(a) - mean(b) and its Welch 95 % interval."""
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    d = statistics.mean(a) - statistics.mean(b)
    h = stats.t.ppf(0.975, df) * (va + vb) ** 0.5
    return d, d - h, d + h


def main() -> None:
    after, before = runs(HERE), runs(BEFORE)
    print(f"after n = {len(after)}, before n = {len(before)} runs; cpu_vs_fp32 after - before, "
          "mean [Welch 95% interval]")
    for key in after[0]:
        if key[1] in ("fp32",) or key not in before[0]:
            continue
        a, b = [r[key] for r in after], [r[key] for r in before]
        d, lo, hi = welch(a, b)
        kind = "primary" if key[1].partition("@")[2] and key[1].partition("@")[0] in PRIMARY \
            else "control"
        v = "lower" if hi < 0 else "higher" if lo > 0 else "unresolved"
        print(f"{key[0]:10s} {key[1]:22s} {statistics.mean(b):5.3f} -> {statistics.mean(a):5.3f}"
              f"  {d:+.3f} [{lo:+.3f}, {hi:+.3f}]  {v} ({kind})")


if __name__ == "__main__":
    main()
