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

    NUMBA_NUM_THREADS=1 python benchmarks/bench_sensitivity.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import copy
import platform
import time

import torch

from benchmarks._util import write_json
from snip.models import build_model, get_config
from snip.nn import convert
from snip.sensitivity import Propagation, SensitivityConfig, measure

SETTINGS = {
    "rows8 (1x1024 tokens)": dict(micro_batches=1),
    "rows4 (512 tokens)": dict(micro_batches=1, rows=4),
    "rows2 (256 tokens, controller default)": dict(micro_batches=1, rows=2),
    "rows2 exact propagation": dict(micro_batches=1, rows=2, propagation=Propagation.EXACT),
}
RUN_STEPS, RUN_CYCLES = 250, 2


def batch_fn(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    x = torch.randint(0, 256, (8, 129), generator=g)
    return x[:, :-1], x[:, 1:]


def _stepper(model: torch.nn.Module):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> None:
        _, loss = model(*batch_fn(0))
        loss.backward()
        opt.step()
        opt.zero_grad()
    return step, opt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = build_model(get_config("small"))
    step32, opt = _stepper(model)
    step8, _ = _stepper(convert(copy.deepcopy(model), "fp8_e4m3_tile128"))
    for _ in range(3):
        step32()
        step8()
    jobs = {"step_fp32": step32, "step_fp8": step8}
    for name, kw in SETTINGS.items():
        cfg = SensitivityConfig(step_tokens=1024, **kw)
        jobs[name] = lambda cfg=cfg: measure(model, batch_fn, optimizer=opt, config=cfg)
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, fn in jobs.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best.get(name, float("inf")), time.perf_counter() - t0)
    rows = []
    print(f"CPU: {platform.processor() or platform.machine()}, torch threads {args.threads}")
    print(f"step fp32 {best['step_fp32']:.3f}s, step fp8 {best['step_fp8']:.3f}s")
    print(f"{'cycle':42s} {'seconds':>8s} {'fp32 steps':>10s} {'fp8 steps':>10s} "
          f"{'run overhead':>12s}")
    for name in SETTINGS:
        s = best[name]
        share = RUN_CYCLES * s / (RUN_CYCLES * s + RUN_STEPS * best["step_fp8"])
        rows.append({"setting": name, "seconds": s, "fp32_steps": s / best["step_fp32"],
                     "fp8_steps": s / best["step_fp8"], "default_run_overhead": share})
        print(f"{name:42s} {s:8.3f} {s / best['step_fp32']:10.2f} {s / best['step_fp8']:10.2f} "
              f"{100 * share:11.2f}%")
    write_json("bench_sensitivity.json", {"step_fp32": best["step_fp32"],
                                          "step_fp8": best["step_fp8"], "cycles": rows,
                                          "rounds": args.rounds, "threads": args.threads})


if __name__ == "__main__":
    main()
