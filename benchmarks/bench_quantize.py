"""Quantization throughput on a 4096 x 4096 fp32 tensor, against peers measured in the same run.

    .venv/bin/python benchmarks/bench_quantize.py [--size 4096] [--repeats 7]

Measured the way a library user calls it: a fresh process, ``snip.quantize(x, preset)``, no
``snip.runtime.tune_malloc()``.  A second column repeats every row in a child process that calls
``tune_malloc()`` first (what ``snip train`` does), to show whether the allocator setting still
matters (``--no-child`` skips it).

Rows: ``snip.quantize`` (fused fast path) for the main presets, RNE and stochastic rounding
(``sr``), along the last axis and along axis 0, fp32 and bf16 input; torchao's reference
quantizers on the same input (``to_mx`` + ``to_dtype`` for MXFP4, ``NVFP4Tensor.to_nvfp4`` +
``dequantize`` for NVFP4); the ml_dtypes e2m1 round-trip cast (element only, no scaling); and a
plain ``copy_`` of the tensor into a preallocated one, the memory-bandwidth roof.  Rows are timed
in interleaved rounds (one call of each row per round) and each figure is the median over the
rounds, so that load changes on a shared machine hit every row alike.  Every ratio is against a
row of the same process.  The fast path is checked bit-identical to the PyTorch reference path
on this input before timing.  The ``faults`` column counts minor page faults per call in this
process (no ``tune_malloc``): it shows whether a row touches fresh memory, independent of load.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np
import torch

import snip
from snip.formats import fast

try:
    from benchmarks._util import cpu_info, write_json
except ImportError:  # run as a script from the benchmarks directory
    from _util import cpu_info, write_json

PRESETS = ["fp8_e4m3", "fp8_e4m3_tile128", "mxfp8_e4m3", "mxfp4", "nvfp4", "fp4_e2m1_tile128"]
COPY = "copy_ (bandwidth roof)"
AO_MX, AO_NV = "torchao mxfp4 (to_mx+to_dtype)", "torchao nvfp4 (NVFP4Tensor)"


def torchao_rows(x: torch.Tensor) -> dict[str, Callable[[], object]]:
    try:
        from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx
        from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor
    except ImportError:
        return {}

    def mx():
        s, d = to_mx(x, torch.float4_e2m1fn_x2, 32)
        return to_dtype(d, s, torch.float4_e2m1fn_x2, 32, torch.float32)

    def nv():
        return NVFP4Tensor.to_nvfp4(x).dequantize(torch.float32)

    return {AO_MX: mx, AO_NV: nv}


def check_bit_identical(x: torch.Tensor) -> None:
    cases = [(p, a, r) for p in PRESETS for a in (-1, 0) for r in ("rne", "stochastic")]
    os.environ["SNIP_FAST"] = "0"
    sub = x[:512]
    ref = [snip.quantize(sub, p, axis=a, rounding=r, generator=1) for p, a, r in cases]
    os.environ["SNIP_FAST"] = "1"
    for (p, a, r), want in zip(cases, ref, strict=True):
        got = snip.quantize(sub, p, axis=a, rounding=r, generator=1)
        assert torch.equal(got, want), f"fast path differs from reference for {p} {a} {r}"


def rows_for(x: torch.Tensor) -> dict[str, Callable[[], object]]:
    y = torch.empty_like(x)
    xb = x.bfloat16()
    rows: dict[str, Callable[[], object]] = {COPY: lambda: y.copy_(x),
                                             "clone (copy to a new tensor)": lambda: x.clone()}
    for p in PRESETS:
        rows[f"snip {p}"] = lambda p=p: snip.quantize(x, p)
        rows[f"snip {p} sr"] = lambda p=p: snip.quantize(x, p, rounding="stochastic", generator=1)
        rows[f"snip {p} axis0"] = lambda p=p: snip.quantize(x, p, axis=0)
    for p in ("mxfp4", "nvfp4"):
        rows[f"snip {p} bf16 in/out"] = lambda p=p: snip.quantize(xb, p)
    return rows


CLOCK = time.perf_counter  # --clock cpu: time.process_time (CPU seconds, load-insensitive)


def measure(size: int, repeats: int, peers: bool) -> dict[str, float]:
    """Median seconds per row over ``repeats`` interleaved rounds."""
    x = torch.randn(size, size, generator=torch.Generator().manual_seed(0))
    if fast.enabled():
        check_bit_identical(x)
    rows = rows_for(x)
    slow: dict[str, Callable[[], object]] = {}
    if peers:
        import ml_dtypes

        xn = x.numpy()
        slow = {**torchao_rows(x), "ml_dtypes e2m1 round trip":
                lambda: xn.astype(ml_dtypes.float4_e2m1fn).astype(np.float32)}
    times: dict[str, list[float]] = {k: [] for k in (*rows, *slow)}
    for fn in (*rows.values(), *slow.values()):
        fn()  # warm-up: numba compile / cache load, first-touch of the inputs
    for r in range(repeats):
        for name, fn in rows.items():
            t0 = CLOCK()
            fn()
            times[name].append(CLOCK() - t0)
        if r < max(2, repeats // 2):  # the peers are 20-40x slower: fewer rounds
            for name, fn in slow.items():
                t0 = CLOCK()
                fn()
                times[name].append(CLOCK() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def faults_per_call(size: int) -> dict[str, float]:
    """Minor page faults per call of each fast row: a load-independent sign of fresh memory
    (a 64 MiB fresh allocation costs 16384 faults; a recycled output buffer costs none)."""
    import resource

    x = torch.randn(size, size, generator=torch.Generator().manual_seed(0))
    out = {}
    for name, fn in rows_for(x).items():
        fn()
        fn()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(3):
            fn()
        out[name] = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 3
    return out


def summary(ms: dict[str, float]) -> dict[str, float | None]:
    def ratio(a: str, b: str) -> float | None:
        return ms[b] / ms[a] if a in ms and b in ms else None

    out = {
        "mxfp4_vs_torchao": ratio("snip mxfp4", AO_MX),
        "nvfp4_vs_torchao": ratio("snip nvfp4", AO_NV),
        "fp8_per_tensor_vs_copy": ratio("snip fp8_e4m3", COPY),
        "fp8_tile128_vs_copy": ratio("snip fp8_e4m3_tile128", COPY),
    }
    for p in PRESETS:
        out[f"sr_over_rne_{p}"] = ms[f"snip {p} sr"] / ms[f"snip {p}"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--mallopt", action="store_true",
                    help="call snip.runtime.tune_malloc() first (the child process does)")
    ap.add_argument("--no-child", action="store_true", help="skip the tune_malloc column")
    ap.add_argument("--threads", type=int, default=0, help="torch (and kernel) threads; 0: default")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: time.process_time, the load-insensitive figure (use --threads 1)")
    ap.add_argument("--json-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    global CLOCK
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.clock == "cpu":
        CLOCK = time.process_time
    if args.mallopt:
        from snip.runtime import tune_malloc

        tune_malloc()
    ms = measure(args.size, args.repeats, peers=True)
    if args.json_only:
        print(json.dumps(ms))
        return
    tuned: dict[str, float] = {}
    if not args.no_child:
        cmd = [sys.executable, __file__, "--size", str(args.size), "--repeats",
               str(args.repeats), "--mallopt", "--json-only", "--threads", str(args.threads),
               "--clock", args.clock]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        tuned = json.loads(done.stdout.strip().splitlines()[-1])
    n = args.size * args.size
    flt = faults_per_call(args.size)
    print(f"{args.size}x{args.size} fp32, {torch.get_num_threads()} threads, {args.clock} clock; "
          f"median of {args.repeats} interleaved rounds; CPU: {cpu_info()['summary']}; "
          f"load average {os.getloadavg()[0]:.1f}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"{'row':<34} {'ms':>8} {'Melem/s':>8} {'x copy_':>8} {'x torchao':>9} {'faults':>7}"
          f" | {'tuned ms':>8} {'x copy_':>8} {'x torchao':>9}")
    for k in ms:
        cols = []
        for table in (ms, tuned):
            if k not in table:
                cols.append(f"{'':>8} {'':>8} {'':>9}")
                continue
            peer = table.get(AO_MX if "mxfp4" in k else AO_NV if "nvfp4" in k else "")
            vs = f"{peer / table[k]:9.1f}" if peer and k.startswith("snip") else f"{'':>9}"
            cols.append(f"{table[k] * 1e3:8.1f} {table[COPY] / table[k]:8.3f} {vs}")
        f = f"{flt[k]:7.0f}" if k in flt else f"{'':>7}"
        first = cols[0].split()
        first += [""] * (3 - len(first))
        print(f"{k:<34} {first[0]:>8} {n / ms[k] / 1e6:8.0f} {first[1]:>8} {first[2]:>9} {f}"
              f" | {cols[1]}")
    s = summary(ms)
    st = summary(tuned) if tuned else {}
    print("targets: mxfp4, nvfp4 >= 20x torchao; fp8 per-tensor and tile128 >= 0.5x copy_; "
          "SR <= 1.3x RNE")
    print("no tune_malloc:", {k: round(v, 2) if v else v for k, v in s.items()})
    if st:
        print("tune_malloc:   ", {k: round(v, 2) if v else v for k, v in st.items()})
    name = "bench_quantize.json" if args.clock == "wall" else "bench_quantize_cpu.json"
    path = write_json(name, {
        "size": args.size, "torch": torch.__version__, "machine": platform.machine(),
        "cpu": cpu_info(), "threads": torch.get_num_threads(), "fast_path": fast.enabled(),
        "seconds": ms, "seconds_tune_malloc": tuned, "summary": s, "summary_tune_malloc": st,
        "minor_faults_per_call": flt, "clock": args.clock, "loadavg": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "python benchmarks/bench_quantize.py " + " ".join(sys.argv[1:]),
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
