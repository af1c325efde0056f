"""Post hoc (written after the runs, not pre-registered; descriptive): does ``accum="auto"``
make a preset's step faster than the same preset with fp32 GEMMs on this Zen 4 host?  In every
run of ``bench_train_step.py --auto`` both arms step the same model on the same batches in the
same process, interleaved, each as a ratio to the plain fp32 step of the same round; so per run
the difference ``ratio(preset@auto) - ratio(preset)`` is a paired unit.  Mean and 95 %
t-interval over the runs of each folder, per model and preset (negative: `auto` faster).

    PYTHONPATH=src python benchmarks/results/issue21/epyc/session22/auto_vs_fp32.py
"""

import json
from pathlib import Path

from snip.compare.stats import t_interval

HERE = Path(__file__).parent
FOLDERS = (("threads1_rep", "1"), ("w256_t1", "1"), ("threads2_rep", "2"), ("w256_t2", "2"))


def main() -> None:
    for folder, threads in FOLDERS:
        metric = "cpu_vs_fp32" if threads == "1" else "vs_fp32"
        runs = [json.loads(p.read_text())["runs"][threads]["models"]
                for p in sorted((HERE / folder).glob("run_*.json"))]
        print(f"{folder}: {threads} thread(s), n = {len(runs)} runs, {metric}(@auto) - "
              f"{metric}(fp32 GEMMs), mean [95% t-interval]")
        for model, rec in runs[0].items():
            arms = rec["arms"]
            for arm in arms:
                if not arm.endswith("@auto") or arm.removesuffix("@auto") not in arms:
                    continue
                base = arm.removesuffix("@auto")
                d = [r[model]["arms"][arm][metric] - r[model]["arms"][base][metric] for r in runs]
                m, lo, hi = t_interval(d)
                verdict = "lower" if hi < 0 else "higher" if lo > 0 else "unresolved"
                print(f"  {model:<10} {base:<18} {m:+.3f} [{lo:+.3f}, {hi:+.3f}]  {verdict}")


if __name__ == "__main__":
    main()
