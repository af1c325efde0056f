"""Memory and step time of write-back policies, as ratios measured in one run.

Arms: plain fp32 AdamW (no write-back), direct ``rne`` write-back, ``selective_master`` with a
10 % mask, blanket ``master``.  Memory is the bytes of write-back state a real implementation
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
import statistics
import time
from pathlib import Path

import torch

from snip.audit import random_mask
from snip.optim import WritebackOptimizer, eligible_parameters

OUT = Path(__file__).parent / "out" / "writeback"


def make(arm: str, model_name: str, fmt: str, fraction: float, tile: int):
    from snip.models import build_model

    torch.manual_seed(0)
    model = build_model(model_name)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    named = eligible_parameters(model)
    if arm == "fp32":
        return model, opt, None
    mask = None
    if arm == "selective_master":
        mask = random_mask({n: p.shape for n, p in named}, fraction, tile_size=tile)
    wb = WritebackOptimizer(opt, named, element=fmt, policy=arm, mask=mask, tile_size=tile,
                            record_every=0)
    return model, opt, wb


def step_time(model, opt, wb, batch) -> tuple[float, float]:
    """(full step seconds, optimizer step + write-back seconds)."""
    x, y = batch
    t = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    model(x, y)[1].backward()
    t_opt = time.perf_counter()
    (wb or opt).step()
    end = time.perf_counter()
    return end - t, end - t_opt


def state_bytes(model, opt, wb) -> int:
    if wb is not None:
        return sum(wb.state_bytes().values())
    named = eligible_parameters(model)
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
    torch.set_num_threads(args.threads)
    arms = ["fp32", "rne", "selective_master", "master"]
    built = {a: make(a, args.model, args.format, args.fraction, args.tile_size) for a in arms}
    g = torch.Generator().manual_seed(0)
    vocab = built["fp32"][0].config.vocab_size
    batch = (torch.randint(0, vocab, (args.batch, args.seq_len), generator=g),
             torch.randint(0, vocab, (args.batch, args.seq_len), generator=g))
    times: dict[str, list[tuple[float, float]]] = {a: [] for a in arms}
    for i in range(args.steps + 3):
        for a in arms:
            t = step_time(*built[a], batch)
            if i >= 3:  # warm-up steps create Adam state
                times[a].append(t)
    rows = {}
    for a in arms:
        rows[a] = {"state_bytes": state_bytes(*built[a]),
                   "step_ms": 1e3 * statistics.median(t for t, _ in times[a]),
                   "opt_ms": 1e3 * statistics.median(t for _, t in times[a])}
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
