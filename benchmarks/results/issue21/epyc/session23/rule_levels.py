"""The pre-registered analysis of session 23's part 2 (``PLAN.md``): per case and preset,
``e`` = the per-process median over rounds of ``ratio(adaptive) - ratio(2^14)`` (ratios to the
same round's fp32 step); per pair ``e(after) - e(before)``, mean and 95 % t-interval over the
pairs, and, descriptive, ``e(after)`` and the after-processes' adaptive ratio to fp32.  Session
24's part 1 runs it with another anchor setting (``ANCHOR``, default 16384: session 23's) and
reports ``e(before)`` too.

    PYTHONPATH=src python benchmarks/results/issue21/epyc/session23/rule_levels.py DIR [ANCHOR]
"""

import json
import statistics
import sys
from pathlib import Path

from snip.compare.stats import t_interval


def e_of(rounds: dict, case: str, preset: str, anchor: str) -> float:
    return statistics.median(
        (a - b) / f for a, b, f in zip(rounds[f"{case} {preset} adaptive"],
                                       rounds[f"{case} {preset} {anchor}"],
                                       rounds[f"{case} fp32 0"], strict=True))


def main() -> None:
    d = Path(sys.argv[1])
    anchor = sys.argv[2] if len(sys.argv) > 2 else "16384"
    label = f"2^{int(anchor).bit_length() - 1}"
    pairs = sorted(int(p.stem.split("_")[1]) for p in d.glob("after_*.json"))
    pairs = [i for i in pairs if (d / f"before_{i}.json").exists()]
    load = {arm: [json.loads((d / f"{arm}_{i}.json").read_text())["rounds_s"] for i in pairs]
            for arm in ("before", "after")}
    keys = [k for k in load["after"][0] if k.endswith(" adaptive")]
    print(f"n = {len(pairs)} pairs; mean [95% t-interval]; e = ratio(adaptive) - ratio({label})")
    for k in keys:
        case, preset = k.rsplit(" ", 2)[0], k.rsplit(" ", 2)[1]
        ea = [e_of(r, case, preset, anchor) for r in load["after"]]
        eb = [e_of(r, case, preset, anchor) for r in load["before"]]
        m, lo, hi = t_interval([a - b for a, b in zip(ea, eb, strict=True)])
        verdict = "faster" if hi < 0 else "slower" if lo > 0 else "unresolved"
        am, alo, ahi = t_interval(ea)
        rm, rlo, rhi = t_interval([statistics.median(a / f for a, f in zip(
            r[k], r[f"{case} fp32 0"], strict=True)) for r in load["after"]])
        print(f"{case:16s} {preset:11s} after - before {m:+.3f} [{lo:+.3f}, {hi:+.3f}] "
              f"{verdict:10s} | e(after) {am:+.3f} [{alo:+.3f}, {ahi:+.3f}] | after's adaptive "
              f"ratio {rm:.3f} [{rlo:.3f}, {rhi:.3f}]" + ("" if anchor == "16384" else
              " | e(before) {:+.3f} [{:+.3f}, {:+.3f}]".format(*t_interval(eb))))


if __name__ == "__main__":
    main()
