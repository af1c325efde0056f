"""The internal-pilot rule of `benchmarks/prereg/snip_study.md`: SDs only, then n.

After the first ``--pilot`` bases have every arm finished, this prints -- and writes to
``--out`` -- the standard deviation over bases of each pre-registered contrast's per-base
difference in the primary metric (high-precision validation loss), the largest of them, and

    n = clamp(n_80(delta_min, SD_max), 32, 48)   (never below an n fixed earlier)

where ``n_80`` is the number of bases a two-sided 95 % t test needs for 80 % power at
``delta_min`` (`snip.compare.stats.n_for_power`).  It never prints a mean, an interval or a
verdict: the pilot looks at the noise, not at the effects, so choosing n cannot be steered by
them.

    PYTHONPATH=src python benchmarks/snip_study_pilot.py \\
        benchmarks/out/snip_study/stage1 --out benchmarks/prereg/snip_study_stage1_pilot.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from snip.compare.stats import PRIMARY, HypothesisSpec, contrast, n_for_power, pilot_n
from snip.compare.sweep import HYPOTHESES_FILE, RESULT_FILE, _families, load_sweep


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep", type=Path)
    p.add_argument("--pilot", type=int, default=8, help="bases in the pilot")
    p.add_argument("--low", type=int, default=32)
    p.add_argument("--high", type=int, default=48)
    p.add_argument("--current", type=int, default=0, help="an n fixed earlier (never lowered)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    sweep = load_sweep(args.sweep)
    d = json.loads((args.sweep / HYPOTHESES_FILE).read_text())
    specs = [HypothesisSpec.from_dict(h) for h in d["hypotheses"] if not h.get("exploratory")]
    units = [u for u in sweep.units if u[0] < args.pilot]
    results: dict = {}
    for arm in sweep.arms:
        for u in units:
            path = sweep.run_dir(u, arm) / RESULT_FILE
            if path.is_file():
                results.setdefault(arm.label, {})[u] = json.loads(path.read_text())
    missing = [a.label for a in sweep.arms if len(results.get(a.label, {})) < len(units)]
    if missing:
        print(f"pilot: {len(missing)} arms have not finished the first {args.pilot} bases "
              f"(e.g. {missing[0]}); run the sweep further first", file=sys.stderr)
        return 1
    families = _families(sweep.arms)
    sds = {}
    for h in specs:
        for arm, comp in h.contrasts:
            c = contrast(results, arm, comp, PRIMARY, families)
            sds[f"{h.id}: {arm} - {comp}"] = float(np.std(c.diffs, ddof=1))
    delta = float(d["delta_min"])
    sd_max = max(sds.values())
    n = pilot_n(list(sds.values()), delta, args.low, args.high, args.current)
    record = {"pilot_bases": args.pilot, "delta_min": delta, "sd": sds, "sd_max": sd_max,
              "n_80": n_for_power(sd_max, delta), "n": n}
    for k, v in sds.items():
        print(f"SD {v:.5f}  {k}")
    print(f"SD max {sd_max:.5f} -> n_80 = {record['n_80']} -> n = {n}")
    if args.out:
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
