"""QLinear vs nn.Linear: forward+backward step time and saved-activation bytes.

Every figure is a ratio measured in the same run against a baseline (``nn.Linear`` in fp32 and
in bf16 on the same input), because the machine is shared and noisy.  For each size
``tokens x in x out`` and each format (all three GEMMs in that format) it reports:

* step time (forward + backward, median of ``--repeats``) of ``QLinear`` with ``save=hp`` and
  ``save=encoded``; its ratio to the fp32 ``nn.Linear`` step is the median of per-round ratios
  with the fp32 step run right before it in each round (``/fp32``), its ratio to bf16 is
  against the bf16 baseline's median;
* where the CPU multiplies bf16 natively (``amx_bf16`` / ``avx512_bf16``), the ``hp`` step with
  ``accum="auto"`` (GEMMs on bf16 operands, bf16 outputs; see :mod:`snip.nn.gemm`);
* bytes saved for backward: bf16 ``X`` (what an autocast bf16 layer keeps), ``QLinear``'s hp
  (fp32 ``X``) and encoded (packed ``Q_wgrad(X)``) activations, with ratios to bf16;
* for the largest size, a breakdown of one quantized step: time in the six operand
  quantizations vs the three fp32 GEMMs.

Run in a fresh process without ``snip.runtime.tune_malloc()`` (as a library user runs it;
``--mallopt`` turns it on).  The bf16 ``nn.Linear`` baseline runs at every size where bf16 GEMMs
are native and only up to 1024^3 elsewhere (on AVX2-only CPUs one 2048^3 bf16 step takes ~100 s),
so the script finishes in a few minutes.  The machine's CPU model and flags are printed and
saved with the figures.

Usage::

    python benchmarks/bench_linear.py            # 512^3, 1024^3, 2048^3
    python benchmarks/bench_linear.py --quick    # 128^3, 256^3

Writes ``benchmarks/out/bench_linear.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from snip.formats import get_spec, quantize
from snip.nn import QLinear, SaveMode
from snip.nn.gemm import bf16_gemm_native, weight_reusable
from snip.runtime import tune_malloc

try:
    from benchmarks._util import cpu_info
except ImportError:  # run as a script from the benchmarks directory
    from _util import cpu_info

FULL_SIZES = [(512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048)]
QUICK_SIZES = [(128, 128, 128), (256, 256, 256)]
PRESETS = ["mxfp4", "nvfp4", "fp4_e2m1_tile128", "fp8_e4m3"]
BF16_SLOW_CAP = 1024**3  # largest bf16 baseline (tokens*in*out) where bf16 is not native
OUT = Path(__file__).parent / "out" / "bench_linear.json"


CLOCK = time.perf_counter  # --clock cpu: time.process_time (CPU seconds, load-insensitive)


def median_time(fn: Callable[[], object], repeats: int, warmup: int) -> float:
    """Median seconds (on ``CLOCK``) of ``repeats`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = CLOCK()
        fn()
        times.append(CLOCK() - t0)
    return statistics.median(times)


def timed(fn: Callable[[], None], repeats: int, warmup: int = 1) -> float:
    """Median wall time of ``fn`` in milliseconds."""
    return median_time(fn, repeats, warmup) * 1e3


def step_fn(layer: nn.Module, x: torch.Tensor, dy: torch.Tensor) -> Callable[[], None]:
    """One training step of ``layer``: forward, backward, gradients dropped."""
    def step() -> None:
        xs = x.detach().requires_grad_()
        layer(xs).backward(dy)
        layer.zero_grad(set_to_none=True)
    return step


def baseline_times(t: int, k: int, n: int, repeats: int, bf16_repeats: int) -> dict[str, float]:
    torch.manual_seed(0)
    lin = nn.Linear(k, n)
    x, dy = torch.randn(t, k), torch.randn(t, n)
    fp32 = timed(step_fn(lin, x, dy), repeats)
    if not bf16_gemm_native() and t * k * n > BF16_SLOW_CAP:
        return {"fp32_ms": fp32, "bf16_ms": float("nan")}  # capped: ~100 s per step on AVX2
    lin16 = nn.Linear(k, n).bfloat16()
    warm = 1 if bf16_repeats > 1 else 0
    bf16 = timed(step_fn(lin16, x.bfloat16(), dy.bfloat16()), bf16_repeats, warmup=warm)
    return {"fp32_ms": fp32, "bf16_ms": bf16}


def paired(fn: Callable[[], None], base: Callable[[], None], repeats: int) -> tuple[float, float]:
    """Median ms of ``fn`` and the median of its per-round ratio to ``base``, the two run
    back to back in each round (a shared machine's load then hits both alike)."""
    fn()
    base()
    times, ratios = [], []
    for _ in range(repeats):
        tb = median_time(base, 1, 0)
        tf = median_time(fn, 1, 0)
        times.append(tf)
        ratios.append(tf / tb)
    return statistics.median(times) * 1e3, statistics.median(ratios)


def qlinear_row(t: int, k: int, n: int, preset: str, repeats: int) -> dict[str, float]:
    torch.manual_seed(0)
    x, dy = torch.randn(t, k), torch.randn(t, n)
    base = step_fn(nn.Linear(k, n), x, dy)
    row: dict[str, float] = {}
    for save in SaveMode:
        q = QLinear(k, n, specs=preset, save=save)
        row[f"{save.value}_ms"], row[f"{save.value}_vs_fp32"] = paired(step_fn(q, x, dy), base,
                                                                       repeats)
        q(x.requires_grad_())  # one differentiable forward to read the saved bytes
        x.requires_grad_(False)
        row[f"saved_{save.value}_bytes"] = q.saved_bytes
    row["auto_ms"] = row["auto_vs_fp32"] = float("nan")
    if bf16_gemm_native():
        q = QLinear(k, n, specs=preset, save=SaveMode.HP, accum="auto")
        row["auto_ms"], row["auto_vs_fp32"] = paired(step_fn(q, x, dy), base, repeats)
    return row


def breakdown(t: int, k: int, n: int, preset: str, repeats: int) -> dict[str, float]:
    """Where a quantized step's time goes: operand quantization vs the GEMMs themselves (a
    weight that fprop quantizes and dgrad reuses, 2-D tiles, is counted once)."""
    spec = get_spec(preset)
    w_spec = spec.for_weight()
    x, w, dy = torch.randn(t, k), torch.randn(n, k), torch.randn(t, n)
    quant = {
        "fprop_x": lambda: quantize(x, spec, axis=-1),
        "fprop_w": lambda: quantize(w, w_spec, axis=-1),
        "dgrad_dy": lambda: quantize(dy, spec, axis=-1, rounding=spec.grad_rounding, generator=1),
        "dgrad_w": lambda: quantize(w, w_spec, axis=0),
        "wgrad_dy": lambda: quantize(dy, spec, axis=0, rounding=spec.grad_rounding, generator=2),
        "wgrad_x": lambda: quantize(x, spec, axis=0),
    }
    if weight_reusable(spec, spec):  # the step quantizes W once and reuses it for dgrad
        del quant["dgrad_w"]
    out = {f"quantize_{name}_ms": timed(fn, repeats) for name, fn in quant.items()}
    gemms = lambda: (x @ w.t(), dy @ w, dy.t() @ x)  # noqa: E731
    out["gemms_fp32_ms"] = timed(gemms, repeats)
    out["quantize_total_ms"] = sum(v for name, v in out.items() if name.startswith("quantize_"))
    return out


def run(sizes: list[tuple[int, int, int]], repeats: int, bf16_repeats: int) -> dict:
    results = {"torch": torch.__version__, "threads": torch.get_num_threads(), "cpu": cpu_info(),
               "bf16_gemm_native": bf16_gemm_native(), "sizes": []}
    print(f"CPU: {results['cpu']['summary']}; torch threads {results['threads']}; "
          f"bf16 GEMM native: {results['bf16_gemm_native']}")
    for t, k, n in sizes:
        base = baseline_times(t, k, n, repeats, bf16_repeats if t * k * n >= 2048**3 else repeats)
        entry = {"tokens": t, "in": k, "out": n, **base, "bf16_x_bytes": t * k * 2, "formats": {}}
        for preset in PRESETS:
            row = qlinear_row(t, k, n, preset, repeats)
            row["hp_vs_bf16"] = row["hp_ms"] / base["bf16_ms"]
            row["encoded_vs_bf16"] = row["encoded_ms"] / base["bf16_ms"]
            row["saved_encoded_vs_bf16"] = row["saved_encoded_bytes"] / entry["bf16_x_bytes"]
            row["saved_hp_vs_bf16"] = row["saved_hp_bytes"] / entry["bf16_x_bytes"]
            entry["formats"][preset] = row
        results["sizes"].append(entry)
        print_size(entry)
    t, k, n = sizes[-1]
    results["breakdown"] = {p: breakdown(t, k, n, p, repeats) for p in PRESETS}
    print_breakdown(results["breakdown"], sizes[-1])
    return results


def print_size(e: dict) -> None:
    print(f"\n{e['tokens']}x{e['in']}x{e['out']}  nn.Linear fp32 {e['fp32_ms']:.1f} ms, "
          f"bf16 {e['bf16_ms']:.1f} ms;  bf16 X = {e['bf16_x_bytes']} B")
    print(f"{'format':16s} {'hp ms':>8s} {'/fp32':>6s} {'/bf16':>6s} {'auto ms':>8s} {'/fp32':>6s}"
          f" {'enc ms':>8s} {'/bf16':>6s}"
          f" {'saved hp B':>11s} {'/bf16':>5s} {'saved enc B':>11s} {'/bf16':>5s}")
    for p, r in e["formats"].items():
        print(f"{p:16s} {r['hp_ms']:8.1f} {r['hp_vs_fp32']:6.2f} {r['hp_vs_bf16']:6.2f}"
              f" {r.get('auto_ms', float('nan')):8.1f} {r['auto_vs_fp32']:6.2f}"
              f" {r['encoded_ms']:8.1f} {r['encoded_vs_bf16']:6.2f}"
              f" {r['saved_hp_bytes']:11d} {r['saved_hp_vs_bf16']:5.2f}"
              f" {r['saved_encoded_bytes']:11d} {r['saved_encoded_vs_bf16']:5.2f}")


def print_breakdown(b: dict, size: tuple[int, int, int]) -> None:
    print(f"\nbreakdown at {'x'.join(map(str, size))} (ms)")
    for p, r in b.items():
        parts = ", ".join(f"{k[9:-3]} {v:.0f}" for k, v in r.items()
                          if k.startswith("quantize_") and k != "quantize_total_ms")
        print(f"{p:10s} quantize total {r['quantize_total_ms']:.0f} ({parts}); "
              f"3 fp32 GEMMs {r['gemms_fp32_ms']:.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes only (seconds)")
    ap.add_argument("--repeats", type=int, default=3, help="timed steps per measurement")
    ap.add_argument("--bf16-repeats", type=int, default=1,
                    help="timed bf16 baseline steps at 2048^3 and above (slow on AVX2 CPUs)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--mallopt", action="store_true", help="call snip.runtime.tune_malloc() first")
    ap.add_argument("--size", type=int, default=0, help="one size n x n x n instead of the list")
    ap.add_argument("--threads", type=int, default=0, help="torch (and kernel) threads; 0: default")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: time.process_time, the load-insensitive figure (use --threads 1)")
    args = ap.parse_args()
    global CLOCK
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.clock == "cpu":
        CLOCK = time.process_time
    if args.mallopt:
        tune_malloc()
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    if args.size:
        sizes = [(args.size,) * 3]
    results = run(sizes, args.repeats, args.bf16_repeats)
    results["clock"] = args.clock
    results["loadavg"] = os.getloadavg()
    results["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results["command"] = "python benchmarks/bench_linear.py " + " ".join(sys.argv[1:])
    results["mallopt"] = bool(args.mallopt)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
