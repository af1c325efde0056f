"""Memory and step time of write-back policies, as ratios measured in one run.

Arms: plain fp32 AdamW (no write-back), direct ``rne`` write-back, ``selective_master`` with a
10 % mask, blanket ``master``, each a trainer (`snip.train.loop.Trainer`) stepped in turn.
Memory is the bytes of write-back state a real implementation
holds for the eligible weights (``WritebackOptimizer.state_bytes``: packed stored weights at the
grid's bits per element, fp32 masters plus int64 indices, fp32 Adam moments); the fp32 arm holds
fp32 weights and moments.  Step time is the median wall time of an optimizer step (forward,
backward and write-back) and of the optimizer step plus write-back alone, over
interleaved repeats, so machine noise hits every arm alike.
Everything here simulates storage in fp32 carriers on CPU: the *time* ratios measure this
implementation's overhead, not a fused GPU kernel.

    .venv/bin/python benchmarks/bench_writeback.py [--model small] [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path

from snip.audit import random_mask
from snip.optim import eligible_parameters
from snip.train import from_sources
from snip.train.loop import Hook, Trainer

OUT = Path(__file__).parent / "out" / "writeback"


class UpdateTimer(Hook):
    """Wall time of each optimizer update (AdamW + write-back), between the trainer's hooks."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._t = 0.0

    def before_update(self, trainer: Trainer) -> None:
        self._t = time.perf_counter()

    def after_update(self, trainer: Trainer) -> None:
        self.seconds.append(time.perf_counter() - self._t)


def make(arm: str, args: argparse.Namespace) -> tuple[Trainer, UpdateTimer]:
    """A trainer (fp32 GEMMs) whose weights are written back with policy ``arm``."""
    name = f"bench_{arm}"
    shutil.rmtree(OUT / "runs" / name, ignore_errors=True)
    values = {"model.name": args.model, "train.batch_size": args.batch,
              "train.seq_len": args.seq_len, "train.steps": args.steps + 3,
              "train.threads": args.threads, "precision.preset": "fp32",
              "log.progress": False, "run.dir": str(OUT / "runs"), "run.name": name}
    if arm != "fp32":
        values |= {"writeback.policy": arm, "writeback.format": args.format,
                   "writeback.tile_size": args.tile_size}
    if arm == "selective_master":
        probe = Trainer(from_sources(overrides={**values, "writeback.policy": "rne",
                                                "run.name": "bench_probe"}))
        shapes = {n: p.shape for n, p in eligible_parameters(probe.model)}
        probe.close()
        mask = random_mask(shapes, args.fraction, tile_size=args.tile_size)
        values["writeback.mask"] = str(mask.save(OUT / "runs" / "bench_mask.json"))
    timer = UpdateTimer()
    return Trainer(from_sources(overrides=values), hooks=[timer]), timer


def state_bytes(trainer: Trainer) -> int:
    if trainer.writeback is not None:
        return sum(trainer.writeback.wb.state_bytes().values())
    named = eligible_parameters(trainer.model)
    return sum(3 * 4 * p.numel() for _, p in named)  # weights + exp_avg + exp_avg_sq, fp32


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--format", default="e4m3")
    ap.add_argument("--fraction", type=float, default=0.1)
    ap.add_argument("--tile-size", type=int, default=128)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    arms = ["fp32", "rne", "selective_master", "master"]
    built = {a: make(a, args) for a in arms}
    step_s: dict[str, list[float]] = {a: [] for a in arms}
    for i in range(args.steps + 3):
        for a in arms:  # interleaved: machine noise hits every arm alike
            r = built[a][0].step()
            if i >= 3:  # warm-up steps create Adam state
                step_s[a].append(r.seconds)
    rows = {}
    for a in arms:
        trainer, timer = built[a]
        rows[a] = {"state_bytes": state_bytes(trainer),
                   "step_ms": 1e3 * statistics.median(step_s[a]),
                   "opt_ms": 1e3 * statistics.median(timer.seconds[3:])}
        trainer.close()
    base = rows["rne"]
    print(f"model {args.model}, {args.format} analytic grid, mask {args.fraction:.0%}, "
          f"{args.steps} steps")
    print(f"{'arm':<18} {'state MB':>9} {'vs rne':>8} {'vs master':>10} {'step ms':>8} "
          f"{'vs rne':>7} {'opt ms':>7} {'vs rne':>7}")
    for a, r in rows.items():
        r["bytes_vs_rne"] = r["state_bytes"] / base["state_bytes"]
        r["bytes_vs_master"] = r["state_bytes"] / rows["master"]["state_bytes"]
        r["time_vs_rne"] = r["step_ms"] / base["step_ms"]
        r["opt_time_vs_rne"] = r["opt_ms"] / base["opt_ms"]
        print(f"{a:<18} {r['state_bytes'] / 1e6:>9.3f} {r['bytes_vs_rne']:>8.3f} "
              f"{r['bytes_vs_master']:>10.3f} {r['step_ms']:>8.1f} {r['time_vs_rne']:>7.3f} "
              f"{r['opt_ms']:>7.1f} {r['opt_time_vs_rne']:>7.3f}")
    sel, mas = rows["selective_master"], rows["master"]
    saved = (mas["state_bytes"] - sel["state_bytes"]) / 1e6
    extra = (sel["state_bytes"] - base["state_bytes"]) / 1e6
    print(f"selective vs blanket master: saves {saved:.3f} MB; vs direct rne: +{extra:.3f} MB, "
          f"{100 * (base['step_ms'] / sel['step_ms'] - 1):+.1f} % throughput")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "bench.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
