"""Session 12's second pre-registered analysis (PLAN.md here): the trainer's own cost at 2
threads against issue 21's 1.2x, from ``run_<i>.json`` (`bench_train_e2e.py --threads 2
--rounds 1` processes of the current code): each ratio's mean with its 95 % t-interval over
the processes and, for the two target ratios, the verdict (``../e2e_paired.py``'s rule).

    python benchmarks/results/issue21/epyc/session12/threads2/targets.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from e2e_paired import RATIOS, TARGETED, interval, ratios, verdict  # noqa: E402


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
    runs = [ratios(p) for p in sorted(folder.glob("run_*.json"))]
    print(f"{len(runs)} runs from {folder}; mean [95 %] over runs")
    for name in RATIOS:
        m, lo, hi = interval([r[name] for r in runs])
        tail = f" {verdict(lo, hi)}" if name in TARGETED else ""
        print(f"{name:36s} {m:.3f} [{lo:.3f}, {hi:.3f}]{tail}")


if __name__ == "__main__":
    main()
