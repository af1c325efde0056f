"""Session 17's second twins measurement (PLAN.md here): one process, the one-thread twins off
and on by turns (``snip.formats.fast._TWINS``), every round's steps on the same models and
batches; per process, the mean over rounds of (twins on - twins off) of each arm's
``cpu_vs_fp32`` (its CPU-time ratio to the plain fp32 step of the same round and setting).

    PYTHONPATH=src python benchmarks/results/issue21/epyc/session17/twins_ab/ab.py OUT.json
"""

import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[6]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_train_step import QUICK_SHAPES, SHAPES, Arm, batch_for  # noqa: E402
from snip.formats import fast  # noqa: E402

MODELS = ("tiny-deep", "small")
PRESETS = ("bf16", "mxfp4", "nvfp4")
ROUNDS, WARMUP = 20, 3


def main() -> None:
    torch.set_num_threads(1)
    SHAPES.update(QUICK_SHAPES)  # (1024 tokens a step, as --quick)
    out: dict = {"command": " ".join(sys.argv), "rounds": ROUNDS, "models": {}}
    for model in MODELS:
        batch = batch_for(model)
        arms = {a: Arm(model, a, batch) for a in ("fp32", *PRESETS)}
        ratios = {(a, on): [] for a in PRESETS for on in (False, True)}
        for r in range(WARMUP + ROUNDS):
            for on in ((False, True) if r % 2 == 0 else (True, False)):
                fast._TWINS = on
                base = arms["fp32"].step()[1]
                for a in PRESETS:
                    c = arms[a].step()[1]
                    if r >= WARMUP:
                        ratios[(a, on)].append(c / base)
        fast._TWINS = True
        out["models"][model] = {
            a: {"diff_mean": statistics.mean(t - f for f, t in zip(ratios[(a, False)],
                                                               ratios[(a, True)], strict=True)),
                "off": ratios[(a, False)], "on": ratios[(a, True)]} for a in PRESETS}
        print(model, {a: round(v["diff_mean"], 4) for a, v in out["models"][model].items()},
              flush=True)
    out["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    Path(sys.argv[1]).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
