"""One quantizer call at the operand shapes of the small models (issue 21), per preset, axis and
rounding: what a training step at width 64-256 calls hundreds of times.

``snip.nn.gemm.quantize_operand`` (the call a layer makes for each GEMM operand) on fp32
operands of 1024 tokens by 64, 192, 128, 256 and 704 features (the activations of
``tiny-deep``, ``small`` and ``w256`` at 1024 tokens per step), along the last axis (fprop and
dgrad operands) and axis 0 (wgrad operands), round-to-nearest-even and stochastic, every preset
of ``bench_train_step.py`` but ``bf16``; ``--bf16``: the operands made in bf16, as for bf16
GEMMs (``accum="auto"``).  Calls are timed in interleaved rounds (one batch of calls of every
case per round, CPU time of this process, 1 thread) and each figure is the median per call over
the rounds.  Run it on two commits to compare them (alternate the processes).  The kernels are
first put in numba's cache by a child process (``snip.formats.warm``) and loaded from there;
``--no-warm`` skips that, so that with an empty ``NUMBA_CACHE_DIR`` this process compiles them
itself (RESULTS §7g compares the two).

``--placed`` adds, for every stochastically rounded case, the same call with its tokens placed
as the second half of a batch twice as long (``tokens=RowShard(1024, 2048)``: one of two
ranks', or the second micro-batch's, operand), timed in the same rounds; its ``vs_unplaced``
is the median over rounds of its time over the unplaced call's (RESULTS §7y).

    PYTHONPATH=src python benchmarks/bench_small_calls.py --out calls.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from snip.formats import Rounding, RowShard, get_spec
from snip.nn.gemm import quantize_operand

try:
    from benchmarks._util import cpu_info, warm_kernels
except ImportError:  # run as a script from the benchmarks directory
    from _util import cpu_info, warm_kernels

PRESETS = ["fp8_e4m3", "fp8_e4m3_tile128", "mxfp8_e4m3", "mxfp4", "nvfp4", "fp4_e2m1_tile128",
           "fp4_e2m1_tensor"]
FEATURES = [64, 192, 128, 256, 704]
TOKENS = 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=20, help="calls of a case per round")
    ap.add_argument("--bf16", action="store_true", help="operands made in bf16 (bf16 GEMMs)")
    ap.add_argument("--placed", action="store_true",
                    help="also each stochastic case with its tokens placed in a larger batch")
    ap.add_argument("--no-warm", action="store_true",
                    help="do not fill numba's cache first (compile in this process if empty)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if not args.no_warm:
        warm_kernels()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    cases = []
    shard = RowShard(TOKENS, 2 * TOKENS)
    for preset in PRESETS:
        spec = get_spec(preset)
        for f in FEATURES:
            x = torch.randn(TOKENS, f, generator=g)
            for axis in (-1, 0):
                for rounding in (Rounding.RNE, Rounding.STOCHASTIC):
                    name = f"{preset} {TOKENS}x{f} axis {axis} {rounding.value}"
                    cases.append((name, x, spec, axis, rounding, None))
                    if args.placed and rounding is Rounding.STOCHASTIC:
                        cases.append((name + " placed", x, spec, axis, rounding, shard))
    times: dict[str, list[float]] = {c[0]: [] for c in cases}
    for _, x, spec, axis, rounding, tokens in cases:  # compile and plan outside the rounds
        quantize_operand(x, spec, axis, rounding, 7, tokens, bf16=args.bf16)
    for _ in range(args.rounds):
        for name, x, spec, axis, rounding, tokens in cases:
            c0 = time.process_time()
            for i in range(args.calls):
                quantize_operand(x, spec, axis, rounding, 7 + i, tokens, bf16=args.bf16)
            times[name].append((time.process_time() - c0) / args.calls * 1e6)
    rows = {name: {"us": statistics.median(ts), "rounds_us": ts} for name, ts in times.items()}
    for name, r in rows.items():
        if name.endswith(" placed"):
            base = times[name.removesuffix(" placed")]
            r["vs_unplaced"] = statistics.median(t / b for t, b in zip(times[name], base,
                                                                        strict=True))
        ratio = f"  {r['vs_unplaced']:.3f}x unplaced" if "vs_unplaced" in r else ""
        print(f"{name:55s} {r['us']:8.1f} us{ratio}")
    args.out.write_text(json.dumps({
        "command": "python benchmarks/bench_small_calls.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "torch": torch.__version__, "cpu": cpu_info(), "threads": 1, "bf16": args.bf16,
        "placed": str(shard) if args.placed else None,
        "numba_cache_dir": os.environ.get("NUMBA_CACHE_DIR", "(default)"),
        "warmed": not args.no_warm, "calls": rows,
    }, indent=1))


if __name__ == "__main__":
    main()
