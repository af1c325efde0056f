"""Where a whole quantized training step's time goes, call by call, measured inside the step
(issue 21: the "rest" of RESULTS §7d).

``profile_layer_step.py`` times one layer and each quantizer call on its own; this script asks
what the same calls cost *inside* a model's training step, where the GEMMs, the autograd engine
and the other layers run between them.  For one model and preset (``mxfp4@auto``: with
``accum="auto"``), in one process, 1 thread (``--threads N``: N, and part 1 in wall time):

1. **Split of the step** (CPU ms, medians over interleaved rounds): plain fp32; ``snip_fp32``
   (converted, nothing quantized: snip's layer code alone); *replay*, the preset's step with
   every ``quantize_operand`` call answered by the tensor that call returned in a recorded step
   (the same GEMMs on the same quantized operands, no quantizer work); *copy*, every call
   answered by a fresh copy of its input in the operand's dtype (:func:`copy_operand`: the
   bytes any out-of-place quantizer writes, and nothing else); and the real step.
   ``real - replay`` is what the quantizer calls cost in the step, ``replay - snip_fp32`` what
   the quantized operands change elsewhere (the GEMMs, seeds, and operands read from memory
   that a recorded step wrote long ago), ``snip_fp32 - fp32`` the layer code; ``copy -
   snip_fp32`` is the floor of writing every operand anew, ``real - copy`` the quantizers'
   work above that floor.
2. **Each kind of call** (shape, axis, rounding): its wall time inside the step and that of its
   numba kernel alone (every entry kernel and its one-thread twin wrapped: ``_ENTRY_KERNELS``),
   against the same call repeated on its own on the same operand (warm caches), medians; per
   step, the sums.  The in-step times include this script's timing wrapper and the cold caches
   a call meets where it runs; they are not what moving or batching the calls would save
   (quantizing all weights in one loop at the start of the step saved nothing, RESULTS §7v):
   read part 1 for the calls' share of the step.

    PYTHONPATH=src python benchmarks/profile_step_calls.py --model tiny-deep --preset mxfp4
"""

from __future__ import annotations

import argparse
import collections
import inspect
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import snip.nn.gemm as gemm
from snip.formats import fast

try:
    from benchmarks._util import cpu_info
    from benchmarks.bench_train_step import SHAPES, Arm
except ImportError:  # run as a script from the benchmarks directory
    from _util import cpu_info
    from bench_train_step import SHAPES, Arm

_REAL = gemm.quantize_operand
_SIGNATURE = inspect.signature(_REAL)


def _batch(model: str, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    seq = SHAPES[model][1] if model in SHAPES else 128
    g = torch.Generator().manual_seed(1)
    tok = torch.randint(256, (tokens // seq, seq + 1), generator=g)
    return tok[:, :-1].contiguous(), tok[:, 1:].contiguous()


def copy_operand(x: torch.Tensor, spec, axis: int, rounding, seed: int, tokens=None,
                 bf16: bool = False, activation: bool = False) -> torch.Tensor:
    """``quantize_operand``'s stand-in for the *copy* step (its parameters, bound by Python
    itself: no per-call ``Signature.bind``, ~6 us a call, in the step; RESULTS §7au): a fresh
    copy of ``x`` in the dtype the real call returns (bf16 for a bf16 GEMM's operand, else
    fp32), in memory from the allocator the real call's output comes from (``fast.empty_like``:
    snip's buffer cache for large outputs); an identity spec's operand passes through as the
    real call passes it."""
    if spec.is_identity:
        return _REAL(x, spec, axis, rounding, seed, tokens, bf16=bf16, activation=activation)
    return fast.empty_like(x, torch.bfloat16 if bf16 else torch.float32).copy_(x)


_MODES = ("fp32", "snip_fp32", "replay", "copy", "real")


def split(model: str, preset: str, tokens: int, rounds: int,
          wall: bool = False) -> dict[str, float]:
    """Median CPU ms (``wall``: wall-clock ms, for more than one thread, where CPU time adds up
    every thread's work) of fp32, snip_fp32, replay, copy and real steps (interleaved
    rounds)."""
    clock = 0 if wall else 1  # (Arm.step returns wall and CPU seconds)
    batch = _batch(model, tokens)
    arms = {a: Arm(model, a, batch) for a in ("fp32", "snip_fp32")}
    q = Arm(model, preset, batch)
    recorded: list[torch.Tensor] = []
    at = [0]

    def record(*a, **k):
        out = _REAL(*a, **k)
        recorded.append(out)
        return out

    def replay(*a, **k):
        out = recorded[at[0] % len(recorded)]
        at[0] += 1
        return out

    def step(mode: str) -> float:
        gemm.quantize_operand = {"replay": replay, "copy": copy_operand}.get(mode, _REAL)
        at[0] = 0
        try:
            return q.step()[clock]
        finally:
            gemm.quantize_operand = _REAL

    gemm.quantize_operand = record
    try:
        q.step()
    finally:
        gemm.quantize_operand = _REAL
    times: dict[str, list[float]] = {k: [] for k in _MODES}
    order = ("real", "copy", "replay")
    for r in range(rounds + 2):
        for k in ("fp32", "snip_fp32"):
            t = arms[k].step()[clock]
            if r >= 2:
                times[k].append(t)
        for m in order[r % 3:] + order[:r % 3]:  # (each mode in each place, in turn)
            t = step(m)
            if r >= 2:
                times[m].append(t)
    out = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    out["calls_per_step"] = len(recorded)
    return out


# the kernels a quantizer call enters from Python (fast's module globals, looked up per call)
_ENTRY_KERNELS = ("_fused_rows", "_fused_short_rows", "_fused_cols", "_fused_tiles",
                  "_rows_nvfp4", "_tiles_nvfp4", "_bf16_rows")


def calls(model: str, preset: str, tokens: int, rounds: int) -> list[dict]:
    """Per kind of quantizer call: in-step wall and kernel us, and alone (warm) us."""
    arm = Arm(model, preset, _batch(model, tokens))
    # (every entry kernel a call runs: each parallel build and its one-thread twin, which
    # one-thread calls run)
    kernels = {name + twin: getattr(fast, name + twin) for name in _ENTRY_KERNELS
               for twin in ("", "_1t")}
    cur: dict = {}

    def wrap(name):
        f = kernels[name]

        def w(*a):
            t = time.perf_counter()
            r = f(*a)
            cur["kernel"] = time.perf_counter() - t
            return r
        return w

    log: dict = collections.defaultdict(list)
    sample: dict = {}

    def timed(*a, **k):  # (any signature of quantize_operand: its arguments are bound by name)
        cur.clear()
        t = time.perf_counter()
        out = _REAL(*a, **k)
        elapsed = time.perf_counter() - t
        bound = _SIGNATURE.bind(*a, **k)
        x, spec, axis, rounding = (bound.arguments[n] for n in ("x", "spec", "axis", "rounding"))
        key = (tuple(x.shape), spec.name, axis, rounding.value)
        log[key].append((elapsed, cur.get("kernel", 0.0)))
        bound.arguments["x"] = x.detach().clone()  # (the call alone, later: on a copy)
        sample[key] = bound
        return out

    # a step before the wrappers go in: a kernel compiled while they are in (an empty or stale
    # numba cache) would find a Python wrapper where its compiled caller wants a kernel
    arm.step()
    for name in kernels:
        setattr(fast, name, wrap(name))
    gemm.quantize_operand = timed
    try:
        arm.step()
        log.clear()
        for _ in range(rounds):
            arm.step()
    finally:
        for name, kernel in kernels.items():
            setattr(fast, name, kernel)
        gemm.quantize_operand = _REAL
    rows = []
    for key, v in log.items():
        bound = sample[key]
        alone = []
        for _ in range(30):
            t = time.perf_counter()
            _REAL(*bound.args, **bound.kwargs)
            alone.append(time.perf_counter() - t)
        rows.append({"shape": list(key[0]), "spec": key[1], "axis": key[2], "rounding": key[3],
                     "per_step": len(v) / rounds,
                     "in_step_us": statistics.median(a for a, _ in v) * 1e6,
                     "kernel_in_step_us": statistics.median(k for _, k in v) * 1e6,
                     "alone_us": statistics.median(alone[5:]) * 1e6})
    rows.sort(key=lambda r: -r["in_step_us"] * r["per_step"])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny-deep")
    ap.add_argument("--preset", default="mxfp4")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (above 1 the split is in wall-clock ms)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    info = cpu_info()
    print(f"CPU: {info['summary']}; {args.model}, {args.preset}, {args.tokens} tokens, "
          f"{args.threads} thread(s)")
    wall = args.threads > 1
    sp = split(args.model, args.preset, args.tokens, args.rounds, wall=wall)
    times = ", ".join(f"{k} {v:.1f}" for k, v in sp.items() if k != "calls_per_step")
    print(f"step, {'wall' if wall else 'CPU'} ms: {times}; "
          f"{sp['calls_per_step']} quantizer calls per step")
    rows = calls(args.model, args.preset, args.tokens, max(3, args.rounds // 2))
    print(f"{'shape':>12} {'axis':>4} {'rounding':>10} {'/step':>5} {'in step':>9} "
          f"{'kernel':>8} {'alone':>8}  (us)")
    for r in rows:
        print(f"{str(tuple(r['shape'])):>12} {r['axis']:>4} {r['rounding']:>10} "
              f"{r['per_step']:5.0f} {r['in_step_us']:9.1f} {r['kernel_in_step_us']:8.1f} "
              f"{r['alone_us']:8.1f}")
    tot = {k: sum(r[k] * r["per_step"] for r in rows) / 1e3
           for k in ("in_step_us", "kernel_in_step_us", "alone_us")}
    print(f"per step, ms: in step {tot['in_step_us']:.1f} "
          f"(kernels {tot['kernel_in_step_us']:.1f}), alone {tot['alone_us']:.1f}")
    if args.out:
        args.out.write_text(json.dumps({"command": " ".join(sys.argv), "cpu": info,
                                        "torch": torch.__version__, "threads": args.threads,
                                        "split_clock": "wall" if wall else "cpu",
                                        "split_ms": sp,
                                        "calls": rows, "per_step_ms": tot}, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
