"""Cost of one SNIP statistics cycle, in training steps of the default ``snip train`` model.

The default run trains ``small`` (4 blocks, dim 128) on batches of 8 x 128 tokens, starting in
``fp8_e4m3_tile128``, for 250 steps, re-planning at steps 100 and 200.  This script times, in
interleaved rounds on the same machine (minimum over rounds):

* ``step_fp32``: an unquantized forward + backward + AdamW step (the conservative unit);
* ``step_fp8``: the same step with every GEMM in ``fp8_e4m3_tile128`` (what the default run
  actually executes before and, with FP4, after its first plan);
* one statistics cycle (:func:`snip.sensitivity.measure`) for several settings.

It prints each cycle in both step units and the overhead on a default run (2 cycles, 250
steps), and writes ``benchmarks/out/bench_sensitivity.json``.

``--retest``: the price of sampling.  Train ``small`` for ``--train-steps`` fp32 steps on the
embedded corpus, measure ``--tables`` tables on disjoint calibration batches for each setting,
and print the test-retest Spearman of the per-layer objective (FP4 minus FP8, summed over GEMMs)
between single tables and between EMA pairs (``blend`` of two tables vs the next two): how much
the controller's averaging buys back.  Writes ``benchmarks/out/bench_sensitivity_retest.json``.

    NUMBA_NUM_THREADS=1 python benchmarks/bench_sensitivity.py [--rounds 3] [--retest]
"""

from __future__ import annotations

import argparse
import itertools
import platform
import shutil
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

from benchmarks._util import write_json
from snip.sensitivity import Propagation, SensitivityConfig, SensitivityTable, blend, measure
from snip.train import from_sources
from snip.train.loop import CALIBRATION_KEY, Trainer

SETTINGS = {
    "rows8 (1x1024 tokens)": dict(calib_batches=1),
    "rows4 (512 tokens)": dict(calib_batches=1, calib_rows=4),
    "rows2 (256 tokens, controller default)": dict(calib_batches=1, calib_rows=2),
    "rows2 exact propagation": dict(calib_batches=1, calib_rows=2, propagation=Propagation.EXACT),
}
RUN_STEPS, RUN_CYCLES = 250, 2


RUNS = Path(__file__).resolve().parent / "out" / "bench_sensitivity_runs"


def trainer(name: str, **overrides: object) -> Trainer:
    """The default run's model and batches (``small``, 8 x 128 tokens) in the one trainer."""
    shutil.rmtree(RUNS / name, ignore_errors=True)
    return Trainer(from_sources(overrides={
        "model.name": "small", "precision.mode": "fixed", "log.progress": False,
        "run.dir": str(RUNS), "run.name": name, **overrides}))


def calibration(t: Trainer):
    """The controller's calibration batches of trainer ``t``."""
    def batch_fn(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return t.data.train_batch(CALIBRATION_KEY + i, 8, 128)
    return batch_fn


def _objective(t: SensitivityTable) -> list[float]:
    lo, hi = t.candidates[-1], t.candidates[0]
    return [sum(e.metric(g, lo).objective - e.metric(g, hi).objective
                for g in ("fprop", "dgrad", "wgrad")) for e in t.layers.values()]


def _mean_rho(tables: list[SensitivityTable]) -> float:
    return float(np.mean([spearmanr(_objective(a), _objective(b))[0]
                          for a, b in itertools.combinations(tables, 2)]))


def retest(args: argparse.Namespace) -> None:
    t = trainer("retest", **{"precision.preset": "fp32", "train.steps": args.train_steps,
                             "train.threads": args.threads})
    t.run()
    model, opt = t.model, t.optimizer
    t.close()
    calib = calibration(t)

    out = {}
    for rows in (2, 8):
        cfg = SensitivityConfig(calib_rows=rows, step_tokens=1024)
        tables = [measure(model, calib, optimizer=opt, config=cfg, batch_offset=k)
                  for k in range(args.tables)]
        emas = [blend(blend(None, tables[k], 0.5), tables[k + 1], 0.5)
                for k in range(0, args.tables - 1, 2)]
        out[f"rows{rows}"] = {"single": _mean_rho(tables), "ema2": _mean_rho(emas)}
        print(f"rows={rows}: test-retest Spearman single table {out[f'rows{rows}']['single']:+.2f}"
              f", EMA of 2 {out[f'rows{rows}']['ema2']:+.2f}  ({args.tables} tables, "
              f"{len(tables[0].layers)} layers, {args.train_steps} training steps)")
    write_json("bench_sensitivity_retest.json", {"args": vars(args), **out})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--retest", action="store_true")
    ap.add_argument("--train-steps", type=int, default=150)
    ap.add_argument("--tables", type=int, default=6)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.retest:
        retest(args)
        return
    t32 = trainer("fp32", **{"precision.preset": "fp32", "train.threads": args.threads})
    t8 = trainer("fp8", **{"precision.preset": "fp8_e4m3_tile128",
                           "train.threads": args.threads})
    model, opt, batch_fn = t32.model, t32.optimizer, calibration(t32)
    step32, step8 = t32.step, t8.step  # one optimizer step of the trainer each
    for _ in range(3):
        step32()
        step8()
    jobs = {"step_fp32": step32, "step_fp8": step8}
    for name, kw in SETTINGS.items():
        cfg = SensitivityConfig(step_tokens=1024, **kw)
        jobs[name] = lambda cfg=cfg: measure(model, batch_fn, optimizer=opt, config=cfg)
    best: dict[str, float] = {}
    cpu: dict[str, float] = {}  # process CPU seconds: fairer than wall time at high load
    for _ in range(args.rounds):
        for name, fn in jobs.items():
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            best[name] = min(best.get(name, float("inf")), time.perf_counter() - t0)
            cpu[name] = min(cpu.get(name, float("inf")), time.process_time() - c0)
    rows = []
    print(f"CPU: {platform.processor() or platform.machine()}, torch threads {args.threads}")
    print(f"step fp32 {best['step_fp32']:.3f}s, step fp8 {best['step_fp8']:.3f}s")
    print(f"{'cycle':42s} {'seconds':>8s} {'fp32 steps':>10s} {'fp8 steps':>10s} "
          f"{'run overhead':>12s}")
    for name in SETTINGS:
        s = best[name]
        share = RUN_CYCLES * s / (RUN_CYCLES * s + RUN_STEPS * best["step_fp8"])
        rows.append({"setting": name, "seconds": s, "fp32_steps": s / best["step_fp32"],
                     "fp8_steps": s / best["step_fp8"], "default_run_overhead": share,
                     "cpu_seconds": cpu[name], "cpu_fp32_steps": cpu[name] / cpu["step_fp32"],
                     "cpu_fp8_steps": cpu[name] / cpu["step_fp8"]})
        print(f"{name:42s} {s:8.3f} {s / best['step_fp32']:10.2f} {s / best['step_fp8']:10.2f} "
              f"{100 * share:11.2f}%")
        print(f"{'':42s} cpu {cpu[name]:.3f}s = {cpu[name] / cpu['step_fp32']:.2f} fp32 steps, "
              f"{cpu[name] / cpu['step_fp8']:.2f} fp8 steps")
    import os

    from benchmarks._util import cpu_info
    write_json("bench_sensitivity.json", {"step_fp32": best["step_fp32"],
                                          "step_fp8": best["step_fp8"],
                                          "cpu_step_fp32": cpu["step_fp32"],
                                          "cpu_step_fp8": cpu["step_fp8"], "cycles": rows,
                                          "rounds": args.rounds, "threads": args.threads,
                                          "cpu_info": cpu_info(),
                                          "load_average": os.getloadavg(),
                                          "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                time.gmtime())})


if __name__ == "__main__":
    main()
