"""Where a quantized layer's training step spends its time at the widths studies use (issue 21).

``bench_train_step.py`` says *how much* a converted model's step costs against plain PyTorch;
this script says *why*, one linear layer at a time.  For each layer shape of a model (the
attention projection ``dim -> dim`` and the two FFN shapes ``dim -> ffn``, ``ffn -> dim``, at
1024 tokens) and each preset it times, in one process with interleaved rounds and this
process's CPU time (1 thread):

- ``linear``: ``nn.Linear`` forward + backward (three fp32 GEMMs through autograd);
- ``snip_fp32``: the same layer converted, every GEMM in fp32: snip's autograd Function with
  nothing quantized, so ``snip_fp32 - linear`` is the **Function's own cost** (its Python, the
  saved-tensor bookkeeping, the engine calling back into Python);
- the preset's layer step, and every quantizer call that step makes, recorded by wrapping
  :func:`snip.nn.gemm.quantize_operand` during one step and then timed alone on an operand of
  the same shape, spec, axis and rounding: their sum is the **quantizers' cost**; the same calls
  on a 32 x 32 operand give each call's **fixed cost** (argument checks, output allocation,
  numpy views, the SR key, the kernel's launch), the rest is work proportional to the elements;
- ``rest`` = step - snip_fp32 - quantizers: what remains (a bf16 product, cache effects), which
  is noise-level when the other three explain the step.

``--probe`` adds, per shape, a look at ``rest``: the layer's three fp32 GEMMs alone, the same
with a 32 x 32 MXFP4 quantizer call after each (snip's whole call path), with that call's numba
kernel alone after each (its arguments made once: no Python of snip's), and with a 32 x 32
``clone`` after each (a torch op of the same size, the control); and each of those calls three
times without the GEMMs.  Each round runs every arm, so per round ``arm - gemms - calls alone``
is what the calls add to the GEMMs beyond their own cost; its mean over rounds and 95 %
t-interval are printed: a call path that runs slower between GEMMs than in a tight loop (cold
caches and branch predictors) shows here.

``--floor`` splits the Function's own cost further, on a 16 x 16 -> 16 layer where the GEMMs
cost next to nothing: ``nn.Linear``, a *minimal* Python ``autograd.Function`` doing the same three
fp32 GEMMs (the floor any Python Function pays: ``apply``, ``save_for_backward``, the engine
calling back into Python) and ``snip_fp32``, so ``snip_fp32 - minimal`` is snip's own Python
per layer step (config, step counter, dispatch on specs, reshapes, the saved-bytes record).

The overhead over ``linear`` is split into these parts in microseconds per layer step; the JSON
keeps every round.  Figures are this machine's: its CPU flags and load are recorded.

Usage::

    PYTHONPATH=src python benchmarks/profile_layer_step.py            # ~2 minutes
    PYTHONPATH=src python benchmarks/profile_layer_step.py --models tiny-deep --presets mxfp4
    PYTHONPATH=src python benchmarks/profile_layer_step.py --floor-only   # ~10 s: --floor alone
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

import snip.nn.gemm as gemm
from snip.compare.stats import t_interval
from snip.formats import QuantSpec, Rounding, fast
from snip.formats.cast import DEFAULT_COUNTERS
from snip.nn import QLinear
from snip.nn.specs import GemmSpecs

try:
    from benchmarks._util import cpu_info
    from benchmarks.bench_train_step import PRESETS, SHAPES, model_config
except ImportError:  # run as a script from the benchmarks directory
    from _util import cpu_info
    from bench_train_step import PRESETS, SHAPES, model_config

MODELS = list(SHAPES)  # bench_train_step's models, built by its model_config
# profiled by default: one model per distinct set of layer shapes (small-deep has small's layers)
DEFAULT_MODELS = ["tiny-deep", "small", "w256"]
TOKENS = 1024
SMALL = (32, 32)  # the operand that measures a call's fixed cost


def layer_shapes(model: str) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of a model's attention projection and its FFN layers."""
    cfg = model_config(model)
    dim, ffn = cfg.dim, cfg.ffn_hidden
    return {"attn": (dim, dim), "ffn_up": (dim, ffn), "ffn_down": (ffn, dim)}


@dataclass(frozen=True)
class Call:
    """One quantizer call a layer step made: its operand's shape and the arguments."""

    shape: tuple[int, ...]
    spec: QuantSpec
    axis: int
    rounding: Rounding
    seed: int
    bf16: bool = False  # made for a bf16 GEMM (accum bf16/auto)

    def runner(self, shape: tuple[int, ...] | None = None) -> Callable[[], object]:
        x = torch.randn(*(shape or self.shape))
        return lambda: gemm.quantize_operand(x, self.spec, self.axis, self.rounding, self.seed,
                                             bf16=self.bf16)

    def describe(self) -> dict[str, object]:
        return {"shape": list(self.shape), "spec": self.spec.name, "axis": self.axis,
                "rounding": self.rounding.value}


def recorded_calls(step: Callable[[], object]) -> list[Call]:
    """The non-identity quantizer calls one run of ``step`` makes (the layer's own path)."""
    calls: list[Call] = []
    real = gemm.quantize_operand

    def spy(x, spec, axis, rounding, seed, tokens=None, **kw):
        if not spec.is_identity:
            calls.append(Call(tuple(x.shape), spec, axis, rounding, seed, kw.get("bf16", False)))
        return real(x, spec, axis, rounding, seed, tokens, **kw)

    gemm.quantize_operand = spy
    try:
        step()
    finally:
        gemm.quantize_operand = real
    return calls


def layer_step(layer: nn.Module, x: torch.Tensor, dy: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        layer(x).backward(dy)
    return run


def cpu_us(fn: Callable[[], object], budget_s: float = 0.02) -> float:
    """CPU microseconds per call: as many calls as fit in ``budget_s`` after a warm-up."""
    for _ in range(3):
        fn()
    n, t0 = 0, time.process_time()
    while (elapsed := time.process_time() - t0) < budget_s:
        fn()
        n += 1
    return elapsed / n * 1e6


def profile_shape(k: int, n: int, presets: list[str], rounds: int) -> dict[str, object]:
    """Every arm of one layer shape, ``rounds`` interleaved rounds; medians and the split."""
    torch.manual_seed(0)
    x = torch.randn(TOKENS, k, requires_grad=True)
    dy = torch.randn(TOKENS, n)
    base = nn.Linear(k, n, bias=False)
    arms: dict[str, Callable[[], object]] = {
        "linear": layer_step(base, x, dy),
        "snip_fp32": layer_step(QLinear.from_linear(base, "fp32"), x, dy)}
    calls: dict[str, list[Call]] = {}
    for p in presets:
        arms[p] = layer_step(QLinear.from_linear(base, p), x, dy)
        calls[p] = recorded_calls(arms[p])
        for i, c in enumerate(calls[p]):
            arms[f"{p}/call{i}"] = c.runner()
            arms[f"{p}/call{i}/small"] = c.runner(SMALL)
    times: dict[str, list[float]] = {a: [] for a in arms}
    for _ in range(rounds):
        for a, fn in arms.items():
            times[a].append(cpu_us(fn))
    med = {a: statistics.median(v) for a, v in times.items()}
    out: dict[str, object] = {"linear_us": med["linear"], "snip_fp32_us": med["snip_fp32"],
                              "rounds": times, "presets": {}}
    function = med["snip_fp32"] - med["linear"]
    for p in presets:
        per_call = [med[f"{p}/call{i}"] for i in range(len(calls[p]))]
        fixed = [med[f"{p}/call{i}/small"] for i in range(len(calls[p]))]
        quant = sum(per_call)
        out["presets"][p] = {
            "step_us": med[p], "vs_linear": med[p] / med["linear"],
            "overhead_us": med[p] - med["linear"], "function_us": function,
            "quantizers_us": quant, "quantizer_fixed_us": sum(fixed),
            "rest_us": med[p] - med["snip_fp32"] - quant,
            "calls": [dict(c.describe(), us=u, small_us=f)
                      for c, u, f in zip(calls[p], per_call, fixed, strict=True)]}
    return out


def probe_calls(small: torch.Tensor, out: torch.Tensor) -> dict[str, Callable[[], object]]:
    """The probe's calls on ``small``: snip's MXFP4 quantizer (its fprop operand), the numba
    kernel of that call writing ``out`` (its arguments made once: none of snip's Python), and
    a ``clone``."""
    spec = GemmSpecs.uniform("mxfp4").fprop
    kernel = fast._plan(spec, tuple(small.shape), 1, spec.rounding is Rounding.STOCHASTIC,
                        DEFAULT_COUNTERS)
    views = fast._np(small), fast._np(out)  # (views do not keep their tensors alive)

    def bare_kernel() -> torch.Tensor:
        kernel(*views, 0, 0, fast._TWINS)  # (one thread: the one-thread twin, as the call)
        return out  # (held by this closure while the views are used)

    return {"gemms+quantize": lambda: gemm.quantize_operand(small, spec, -1, spec.rounding, 1),
            "gemms+kernel": bare_kernel, "gemms+clone": small.clone}


def probe_shape(k: int, n: int, rounds: int) -> dict[str, list[float]]:
    """The three GEMMs of a layer step alone and with a small call after each (see --probe);
    ``alone:<arm>``: the same three calls without the GEMMs, in the same round."""
    torch.manual_seed(0)
    x, w, dy = torch.randn(TOKENS, k), torch.randn(n, k), torch.randn(TOKENS, n)
    small = torch.randn(*SMALL)
    between = {"gemms": lambda: None, **probe_calls(small, torch.empty(*SMALL))}

    def with_call(call: Callable[[], object], gemms: bool = True) -> Callable[[], None]:
        def run() -> None:
            for a, b in ((x, w.t()), (dy, w), (dy.t(), x)):
                if gemms:
                    a @ b
                call()
        return run

    arms = {name: with_call(call) for name, call in between.items()}
    arms.update({f"alone:{name}": with_call(call, gemms=False)
                 for name, call in between.items() if name != "gemms"})
    times: dict[str, list[float]] = {a: [] for a in arms}
    for _ in range(rounds):
        for a, fn in arms.items():
            times[a].append(cpu_us(fn, budget_s=0.05))
    return times


def probe_extra(times: dict[str, list[float]]) -> dict[str, tuple[float, float, float]]:
    """Per arm: what the three calls add to the GEMMs beyond their own time alone, per round
    (the arms of a round paired): the mean over rounds and its 95 % t-interval."""
    return {arm: t_interval([t - g - a for t, g, a in zip(
                times[arm], times["gemms"], times[f"alone:{arm}"], strict=True)])
            for arm in ("gemms+quantize", "gemms+kernel", "gemms+clone")}


class MinimalLinearFn(torch.autograd.Function):
    """``X W^T`` with its two backward GEMMs and nothing else: the floor of a Python Function
    (leading dimensions of ``X`` flattened into rows, as a model's activations need)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        if x.dim() == 2:
            return x @ w.t()
        return (x.reshape(-1, x.shape[-1]) @ w.t()).reshape(*x.shape[:-1], -1)

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, w = ctx.saved_tensors
        if x.dim() == 2:
            return dy @ w, dy.t() @ x
        dy2, x2 = dy.reshape(-1, dy.shape[-1]), x.reshape(-1, x.shape[-1])
        return (dy2 @ w).reshape(x.shape), dy2.t() @ x2


FLOOR_SHAPE = (16, 16, 16)  # tokens, in, out: GEMMs of ~1 us, so the rest is per-call cost


def floor_arms(presets: list[str], rounds: int) -> dict[str, list[float]]:
    """CPU us per layer step (forward + backward) at :data:`FLOOR_SHAPE` of ``nn.Linear``, the
    minimal Function, ``snip_fp32`` and each preset; ``rounds`` interleaved rounds."""
    torch.manual_seed(0)
    t, k, n = FLOOR_SHAPE
    x, dy = torch.randn(t, k, requires_grad=True), torch.randn(t, n)
    base = nn.Linear(k, n, bias=False)
    arms: dict[str, Callable[[], object]] = {
        "linear": layer_step(base, x, dy),
        "minimal_function": lambda: MinimalLinearFn.apply(x, base.weight).backward(dy),
        "snip_fp32": layer_step(QLinear.from_linear(base, "fp32"), x, dy),
        **{p: layer_step(QLinear.from_linear(base, p), x, dy) for p in presets}}
    times: dict[str, list[float]] = {a: [] for a in arms}
    for _ in range(rounds):
        for a, fn in arms.items():
            times[a].append(cpu_us(fn, budget_s=0.1))
    return times


def print_table(model: str, layer: str, shape: tuple[int, int], res: dict) -> None:
    print(f"\n{model} {layer}: {TOKENS} tokens x {shape[0]} -> {shape[1]}, "
          f"nn.Linear step {res['linear_us']:.0f} us, snip_fp32 {res['snip_fp32_us']:.0f} us")
    print(f"{'preset':18s} {'vs linear':>9s} {'overhead':>9s} {'Function':>9s} "
          f"{'quantizers':>11s} {'(fixed)':>8s} {'calls':>5s} {'rest':>7s}   us per layer step")
    for p, r in res["presets"].items():
        print(f"{p:18s} {r['vs_linear']:9.2f} {r['overhead_us']:9.0f} {r['function_us']:9.0f} "
              f"{r['quantizers_us']:11.0f} {r['quantizer_fixed_us']:8.0f} "
              f"{len(r['calls']):5d} {r['rest_us']:7.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=DEFAULT_MODELS, choices=MODELS)
    ap.add_argument("--presets", nargs="+", default=list(PRESETS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--probe", action="store_true",
                    help="also time the GEMMs alone vs with a small quantizer call after each")
    ap.add_argument("--floor", action="store_true",
                    help="also split the Function's cost at a 16x16 layer (see the docstring)")
    ap.add_argument("--floor-only", action="store_true", help="--floor, and no model shapes")
    ap.add_argument("--out", type=Path,
                    default=Path("benchmarks/results/issue21/profile_layer_step.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    run: dict[str, object] = {
        "command": " ".join(["benchmarks/profile_layer_step.py", *sys.argv[1:]]),
        "cpu": cpu_info(), "torch": torch.__version__, "threads": 1, "tokens": TOKENS,
        "clock": "process CPU time", "load_before": os.getloadavg(), "models": {}}
    print(run["cpu"]["summary"], f"load {run['load_before'][0]:.1f}")
    if args.floor or args.floor_only:
        times = floor_arms(args.presets, args.rounds)
        med = {a: statistics.median(v) for a, v in times.items()}
        run["floor"] = {"shape": list(FLOOR_SHAPE), "rounds": times, "median_us": med}
        print(f"\nfloor, {FLOOR_SHAPE[0]} tokens x {FLOOR_SHAPE[1]} -> {FLOOR_SHAPE[2]}, CPU us "
              f"per layer step (median of {args.rounds}), and minus the minimal Function:")
        for a, v in med.items():
            print(f"  {a:18s} {v:7.1f}  {v - med['minimal_function']:+7.1f}")
    for model in [] if args.floor_only else args.models:
        run["models"][model] = {}
        for layer, shape in layer_shapes(model).items():
            res = profile_shape(*shape, args.presets, args.rounds)
            res["shape"] = list(shape)
            run["models"][model][layer] = res
            print_table(model, layer, shape, res)
            if args.probe:
                res["probe"] = probe_shape(*shape, args.rounds)
                med = {a: statistics.median(v) for a, v in res["probe"].items()}
                print("probe, us per 3 GEMMs (median): " + ", ".join(
                    f"{a} {v:.0f}" for a, v in med.items()))
                print("  added beyond the calls' own time (mean, 95 % interval over rounds): "
                      + ", ".join(f"{a.split('+')[1]} {m:+.0f} [{lo:+.0f}, {hi:+.0f}]"
                                  for a, (m, lo, hi) in probe_extra(res["probe"]).items()))
    run["load_after"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(run, indent=1) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
