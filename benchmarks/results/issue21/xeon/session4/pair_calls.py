"""Per-call cost of a layer's two ``Q(dY)``: one :func:`snip.formats.fast.quantize_pair` call
against the two :func:`~snip.formats.fast.quantize_fused` calls it replaces, at the ``dY``
shapes of ``bench_train_step.py --quick`` (1024 tokens x every out_features width of tiny-deep,
small and w256), each preset with its gradient rounding and the layer's seeds.

One process, 1 thread, rounds interleaved (pair, two calls, pair, ...); per round each arm is
the median of 9 timings of 20 calls.  Descriptive: the rounds share one process, so their
interval is not over independent units.

    PYTHONPATH=src python benchmarks/results/issue21/xeon/session4/pair_calls.py

``quantize_pair`` was removed after this measurement (RESULTS §7l): run it at commit
``a83f4337`` (``git worktree add /tmp/pair a83f4337``), where the JSON beside it was made.
"""

import json
import statistics
import time
from pathlib import Path

import torch

from snip.compare.stats import t_interval
from snip.formats import fast, get_spec

PRESETS = ("mxfp4", "mxfp8_e4m3", "fp4_e2m1_tile128", "fp8_e4m3_tile128")  # what it serves
WIDTHS = (32, 64, 128, 192, 256, 384, 704)  # every out_features of the three quick models
TOKENS, ROUNDS, REPS, CALLS = 1024, 11, 9, 20


def timed(fn) -> float:
    """Median over REPS of the mean time of CALLS calls, in us."""
    ts = []
    for _ in range(REPS):
        t = time.perf_counter()
        for _ in range(CALLS):
            fn()
        ts.append((time.perf_counter() - t) / CALLS * 1e6)
    return statistics.median(ts)


def main() -> None:
    if not hasattr(fast, "quantize_pair"):
        raise SystemExit("pair_calls.py: snip.formats.fast.quantize_pair is gone from this "
                         "code; run this script at commit a83f4337 (RESULTS §7l)")
    torch.set_num_threads(1)
    flags = next((ln.split(":", 1)[1].split() for ln in open("/proc/cpuinfo")
                  if ln.startswith("flags")), [])
    keep = ("avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "amx_bf16")
    out = {"tokens": TOKENS, "rounds": ROUNDS, "threads": 1,
           "cpu_flags": [f for f in keep if f in flags], "rows": []}
    g = torch.Generator().manual_seed(0)
    for name in PRESETS:
        s = get_spec(name)
        r = s.grad_rounding
        for width in WIDTHS:
            dy = torch.randn(TOKENS, width, generator=g)
            if fast.quantize_pair(dy, s, s, r, r, 1, 2) is None:
                continue

            def pair(dy=dy, s=s, r=r):
                fast.quantize_pair(dy, s, s, r, r, 1, 2)

            def two(dy=dy, s=s, r=r):
                fast.quantize_fused(dy, s, -1, r, 1)
                fast.quantize_fused(dy, s, 0, r, 2)
            pair(), two()
            rounds = [(timed(pair), timed(two)) for _ in range(ROUNDS)]
            d = [p - t for p, t in rounds]
            m, lo, hi = t_interval(d)
            ratio = statistics.median(p / t for p, t in rounds)
            row = {"preset": name, "rounding": r.value, "shape": [TOKENS, width],
                   "pair_us": [p for p, _ in rounds], "two_us": [t for _, t in rounds],
                   "pair_minus_two_us": [m, lo, hi], "median_ratio": ratio}
            out["rows"].append(row)
            print(f"{name:18s} {TOKENS}x{width:<4d} {r.value:10s} pair "
                  f"{statistics.median(row['pair_us']):7.1f} us, two "
                  f"{statistics.median(row['two_us']):7.1f} us: {m:+7.1f} [{lo:+.1f}, {hi:+.1f}]"
                  f" us, ratio {ratio:.3f}")
    path = Path(__file__).with_suffix(".json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
