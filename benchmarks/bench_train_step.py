"""A whole training step of snip's Llama model at the widths precision studies use (64-256).

One step is forward, cross-entropy loss, backward and an AdamW update of
:func:`snip.models.build_model`'s decoder on random tokens.  The baseline is plain PyTorch fp32
(the model never touched by ``snip.convert``); every other arm is the same model (same init)
converted to one preset (all three GEMMs of every linear layer but the LM head), or plain
PyTorch under ``torch.autocast(bfloat16)``, or converted with every GEMM in fp32 (``snip_fp32``:
what snip's layer costs by itself, with nothing quantized).  Because the machine is shared, all
arms run in one process, interleaved: each round runs one step of every arm in turn, and an
arm's figure is the median over rounds of its step time divided by the fp32 step of the same
round.  Both clocks are kept: wall time, and this process's CPU time (``time.process_time``),
which at 1 thread is the load-insensitive figure on a shared machine (at 2 threads it includes
OpenMP spin-waits).

``--auto`` adds, for every preset, the arm ``<preset>@auto``: the same conversion with
``accum="auto"``, i.e. bf16 GEMMs (fp32 accumulation, bf16 output) where the CPU multiplies
bf16 natively (AMX / AVX512-BF16) and fp32 GEMMs elsewhere; the operands are made in bf16 by the
quantizers themselves.  It is not the default (the output rounding differs, and with it the
bits of a run between CPU kinds): it is what a user of a bf16-capable CPU can choose.  With
``--auto`` the adaptive arm below has its ``@auto`` twin too (``snip train --precision.accum
auto``: the controller's plans switch formats, the conversion's ``accum`` stays).

``snip_adaptive`` is SNIP as ``snip train`` runs it by default (``precision.mode adaptive``,
the trainer's controller with every default: candidates fp8_e4m3_tile128 / fp4_e2m1_tile128,
budget 0.75, a statistics cycle every ``precision.every`` = 100 steps): its rounds time a step in
the mixed plan of its first cycle, and after the rounds a few cycles (statistics + solve + apply)
are timed on their own; ``amortized_vs_fp32`` = (median step + median cycle / every) / median
fp32 step, the cost of an average step over one re-plan period.

Models: ``tiny-deep`` (dim 64, 6 blocks, 1024 tokens per step), ``small`` (dim 128, 4 blocks,
4096 tokens), the larger named configs ``small-deep`` (dim 128, 8 blocks) and ``medium`` (dim
256, 8 blocks, ffn 768), and ``w256`` (dim 256, 8 blocks, ffn 704, 4096 tokens; built through
:class:`snip.models.ModelConfig`); ``--quick`` runs 1024 tokens per step.  ``--compile`` adds,
per model, ``torch.compile``-d arms (the fp32 baseline and some presets) against their eager
selves, with the graph breaks and graphs Dynamo counted while compiling the first step.

The quantizer kernels are first put in numba's cache by a child process
(``python -m snip.formats.warm``) and loaded from there, so that every run starts the same way
(RESULTS §7g); ``--no-warm`` skips that.  ``--no-autocast`` leaves out the ``bf16_autocast``
baseline, most of a ``--quick`` run at width 256 on a CPU without native bf16 (13-15x the fp32
step on an AVX2 EPYC, RESULTS §7w).

``--placed`` places every converted arm's tokens as the second half of a batch twice as long
(``QLinear.tokens = RowShard(T, 2T)`` for ``T`` tokens a step): the stochastic rounding coins
and quantizer calls of one of two DDP ranks, or of the second of two micro-batches
(``--train.grad_accum 2``), without the communication (RESULTS §7y).

Each thread count (``--threads 1 2``) is a separate pass.  The CPU model and flags, the load
average before and after, and every per-round time are written to
``benchmarks/results/issue21/bench_train_step[_quick].json``.

Usage::

    python benchmarks/bench_train_step.py --quick     # ~2.5 minutes (2-core EPYC)
    python benchmarks/bench_train_step.py             # all models, more rounds
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
from torch._dynamo.utils import counters

from snip.formats import RowShard
from snip.models import ModelConfig, build_model, get_config
from snip.nn import convert, qlinear_layers
from snip.nn.gemm import bf16_gemm_native
from snip.train.config import DEFAULT_PRESET, PrecisionSection
from snip.train.precision import make_controller

try:
    from benchmarks._util import cpu_info, preset_and_accum, warm_kernels
except ImportError:  # run as a script from the benchmarks directory
    from _util import cpu_info, preset_and_accum, warm_kernels

PRESETS = ["bf16", "fp8_e4m3", "fp8_e4m3_tile128", "mxfp8_e4m3", "mxfp4", "nvfp4",
           "fp4_e2m1_tile128", "fp4_e2m1_tensor"]
COMPILED = ["fp32", "bf16", "mxfp4", "nvfp4"]  # arms timed compiled too (--compile)
RESULTS = Path(__file__).parent / "results" / "issue21"


def model_config(name: str) -> ModelConfig:
    if name == "w256":
        return ModelConfig(dim=256, n_layers=8, n_heads=4, n_kv_heads=2, ffn_hidden=704,
                           vocab_size=256, max_seq_len=256)
    return get_config(name)


# model -> (batch, seq): tokens per step (the table); --quick: 1024 tokens each
SHAPES = {"tiny-deep": (8, 128), "small": (16, 256), "small-deep": (16, 256),
          "medium": (16, 256), "w256": (16, 256)}
QUICK_SHAPES = {"tiny-deep": (8, 128), "small": (4, 256), "small-deep": (4, 256),
                "medium": (4, 256), "w256": (4, 256)}


class Arm:
    """One model + AdamW, stepping on fixed batches."""

    def __init__(self, model_name: str, arm: str, batch: tuple[torch.Tensor, torch.Tensor],
                 compiled: bool = False, placed: bool = False) -> None:
        torch.manual_seed(0)
        model = build_model(model_config(model_name))
        self.autocast = arm == "bf16_autocast"
        if arm == "snip_fp32":  # converted, all GEMMs fp32: the cost of the layer itself
            convert(model, "fp32")
        elif arm not in ("fp32", "bf16_autocast"):
            preset, accum = preset_and_accum(arm)  # "<preset>@auto": accum="auto"
            convert(model, preset, accum=accum)
        self.model = model
        self.fwd: Callable = torch.compile(model) if compiled else model
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        self.tokens, self.targets = batch
        self.placed = placed
        self.place()

    def place(self) -> None:
        """``placed``: every ``QLinear``'s tokens are rows ``T .. 2T - 1`` of ``2T``."""
        if self.placed:
            t = self.tokens.numel()
            for _, m in qlinear_layers(self.model):
                m.tokens = RowShard(t, 2 * t)

    def step(self) -> tuple[float, float]:
        """One step; (wall seconds, CPU seconds of this process)."""
        t0, c0 = time.perf_counter(), time.process_time()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
            _, loss = self.fwd(self.tokens, self.targets)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0, time.process_time() - c0


class AdaptiveArm(Arm):
    """SNIP's default adaptive run: the starting preset, then the controller's plans."""

    CYCLES = 3  # statistics cycles timed after the rounds

    def __init__(self, model_name: str, batch: tuple[torch.Tensor, torch.Tensor],
                 placed: bool = False, auto: bool = False) -> None:
        super().__init__(model_name, DEFAULT_PRESET + ("@auto" if auto else ""), batch,
                         placed=placed)
        b, t = batch[0].shape
        self.ctl = make_controller(PrecisionSection(), Path("."), is_main=False,
                                   step_tokens=b * t)
        assert self.ctl is not None
        self.every, self.due = self.ctl.every, self.ctl.warmup
        self.step()  # AdamW state for the statistics
        self.cycle()  # the rounds train in the first plan's mix of FP8 and FP4
        self.place()  # (again after the cycle, whatever its statistics passes set)

    def _batch(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(10**6 + i)
        tok = torch.randint(self.model.config.vocab_size, (self.tokens.shape[0],
                                                           self.tokens.shape[1] + 1), generator=g)
        return tok[:, :-1].contiguous(), tok[:, 1:].contiguous()

    def cycle(self) -> tuple[float, float]:
        """One re-plan at the next due step: statistics, solve, apply; (wall s, CPU s)."""
        t0, c0 = time.perf_counter(), time.process_time()
        plan = self.ctl.on_step_end(self.due, self.model, self.opt, self._batch)
        assert plan is not None
        plan.apply(self.model)
        self.due += self.every
        return time.perf_counter() - t0, time.process_time() - c0


def adaptive_summary(arm: AdaptiveArm, rows: dict, base: str = "fp32",
                     name: str = "snip_adaptive") -> dict:
    """The cycle's cost and the step averaged over one re-plan period, from medians (``name``:
    the arm's row in ``rows``)."""
    cycles = [arm.cycle() for _ in range(arm.CYCLES)]
    wall = statistics.median(c[0] for c in cycles)
    step, fp32 = rows[name]["ms"] / 1e3, rows[base]["ms"] / 1e3
    return {"every": arm.every, "cycle_ms": wall * 1e3,
            "cycle_step_equivalents": wall / step,
            "amortized_vs_" + base: (step + wall / arm.every) / fp32,
            "fp4_flop_fraction": arm.ctl.history[-1].fp4_flop_fraction,
            "cycle_ms_each": [c[0] * 1e3 for c in cycles]}


def _ratio(ts: list[float], base: list[float]) -> float:
    return statistics.median(t / b for t, b in zip(ts, base, strict=True))


def interleaved(arms: dict[str, Arm], rounds: int, warmup: int, base: str = "fp32") -> dict:
    """Per arm: median wall and CPU ms, and the median per-round ratio of each to ``base``."""
    for _ in range(warmup):
        for a in arms.values():
            a.step()
    wall: dict[str, list[float]] = {k: [] for k in arms}
    cpu: dict[str, list[float]] = {k: [] for k in arms}
    for r in range(rounds):
        order = list(arms) if r % 2 == 0 else list(reversed(arms))  # no fixed neighbour
        for k in order:
            w, c = arms[k].step()
            wall[k].append(w)
            cpu[k].append(c)
    return {k: {"ms": statistics.median(wall[k]) * 1e3, "vs_" + base: _ratio(wall[k], wall[base]),
                "cpu_ms": statistics.median(cpu[k]) * 1e3,
                "cpu_vs_" + base: _ratio(cpu[k], cpu[base]),
                "wall_ms": [t * 1e3 for t in wall[k]], "cpu_ms_rounds": [t * 1e3 for t in cpu[k]]}
            for k in arms}


def batch_for(model_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    b, t = SHAPES[model_name]
    g = torch.Generator().manual_seed(1)
    vocab = model_config(model_name).vocab_size
    tok = torch.randint(vocab, (b, t + 1), generator=g)
    return tok[:, :-1].contiguous(), tok[:, 1:].contiguous()


def bench_model(name: str, rounds: int, warmup: int, presets: list[str],
                auto: bool = False, autocast: bool = True, placed: bool = False) -> dict:
    batch = batch_for(name)
    names = ["fp32", *(["bf16_autocast"] if autocast else []), "snip_fp32", *presets]
    names += [p + "@auto" for p in presets] if auto else []
    arms = {a: Arm(name, a, batch, placed=placed) for a in names}
    arms["snip_adaptive"] = adaptive = AdaptiveArm(name, batch, placed)
    if auto:
        arms["snip_adaptive@auto"] = adaptive_auto = AdaptiveArm(name, batch, placed, auto=True)
    res = interleaved(arms, rounds, warmup)
    b, t = SHAPES[name]
    out = {"tokens_per_step": b * t, "batch": b, "seq": t, "arms": res,
           "adaptive": adaptive_summary(adaptive, res)}
    if auto:
        out["adaptive@auto"] = adaptive_summary(adaptive_auto, res, name="snip_adaptive@auto")
    return out


def bench_compiled(name: str, rounds: int, warmup: int) -> dict:
    """Compiled vs eager for a few arms; ratios to the eager fp32 step of the same round."""
    batch = batch_for(name)
    arms: dict[str, Arm] = {}
    compile_s: dict[str, float] = {}
    graphs: dict[str, dict[str, int]] = {}
    for a in COMPILED:
        arms[a] = Arm(name, a, batch)
        arms[a + "@compiled"] = Arm(name, a, batch, compiled=True)
        torch._dynamo.reset()  # each arm compiles afresh: else it reuses the last arm's graphs
        counters.clear()
        t0 = time.perf_counter()
        arms[a + "@compiled"].step()  # compiles forward and backward
        compile_s[a] = time.perf_counter() - t0
        graphs[a] = {"graph_breaks": sum(counters["graph_break"].values()),
                     "unique_graphs": counters["stats"]["unique_graphs"]}
    res = interleaved(arms, rounds, warmup)
    for a in COMPILED:
        c, e = res[a + "@compiled"], res[a]
        c["vs_eager"] = _ratio(c["wall_ms"], e["wall_ms"])
        c["cpu_vs_eager"] = _ratio(c["cpu_ms_rounds"], e["cpu_ms_rounds"])
        res[a + "@compiled"]["first_step_s"] = compile_s[a]
        res[a + "@compiled"].update(graphs[a])
    return {"arms": res}


def print_table(title: str, rows: dict[str, dict]) -> None:
    print(f"\n{title}")
    print(f"  {'arm':22s} {'wall ms':>8s} {'/fp32':>6s} {'cpu ms':>8s} {'/fp32':>6s}")
    for arm, r in rows.items():
        extra = (f"  vs eager: wall {r['vs_eager']:.2f}x cpu {r['cpu_vs_eager']:.2f}x, "
                 f"{r['graph_breaks']} graph breaks, {r['unique_graphs']} graphs"
                 if "vs_eager" in r else "")
        print(f"  {arm:22s} {r['ms']:8.1f} {r['vs_fp32']:6.2f} {r['cpu_ms']:8.1f} "
              f"{r['cpu_vs_fp32']:6.2f}{extra}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="3 rounds, 1024 tokens per step, 1 thread (2.5 minutes on a 2-core "
                         "EPYC; --auto doubles the arms, each --threads count is a pass)")
    ap.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--presets", nargs="+", default=PRESETS)
    ap.add_argument("--threads", nargs="+", type=int, default=None,
                    help="torch thread counts, one pass each (default: 1 2; --quick: 1)")
    ap.add_argument("--rounds", type=int, default=0, help="timed rounds (0: 3 quick, 11 full)")
    ap.add_argument("--compile", action="store_true", help="add compiled-vs-eager arms")
    ap.add_argument("--auto", action="store_true",
                    help='add every preset with accum="auto" (bf16 GEMMs where native)')
    ap.add_argument("--no-autocast", action="store_true",
                    help="leave out the bf16-autocast baseline (on a CPU without native bf16 "
                         "it is 6-15x the fp32 step: most of a --quick run at width 256)")
    ap.add_argument("--no-warm", action="store_true",
                    help="do not fill numba's cache first (with an empty NUMBA_CACHE_DIR this "
                         "process then compiles the kernels itself)")
    ap.add_argument("--placed", action="store_true",
                    help="place the converted arms' tokens as half of a batch twice as long "
                         "(a DDP rank's or a micro-batch's quantizer calls)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    rounds = args.rounds or (3 if args.quick else 11)
    warmup = 1 if args.quick else 2
    if args.quick:
        SHAPES.update(QUICK_SHAPES)
    out = args.out or RESULTS / ("bench_train_step_quick.json" if args.quick
                                 else "bench_train_step.json")
    if not args.no_warm:
        warm_kernels()
    info = cpu_info()
    results: dict = {
        "command": "python benchmarks/bench_train_step.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "torch": torch.__version__,
        "cpu": info, "snip_fast": os.environ.get("SNIP_FAST", "1"), "rounds": rounds,
        "bf16_gemm_native": bf16_gemm_native(), "warmed": not args.no_warm,
        "placed": args.placed,
        "loadavg_before": os.getloadavg(), "runs": {}}
    print(f"CPU: {info['summary']}; bf16 GEMMs native: {bf16_gemm_native()}; "
          f"load {os.getloadavg()}")
    for threads in args.threads or ([1] if args.quick else [1, 2]):
        torch.set_num_threads(threads)
        run: dict = {"models": {}, "compiled": {}}
        for name in args.models:
            run["models"][name] = bench_model(name, rounds, warmup, args.presets, args.auto,
                                              not args.no_autocast, args.placed)
            print_table(f"{name} ({run['models'][name]['tokens_per_step']} tokens/step), "
                        f"{threads} thread(s)", run["models"][name]["arms"])
            for key in ("adaptive", "adaptive@auto"):
                if key not in run["models"][name]:  # (@auto: with --auto only)
                    continue
                ad = run["models"][name][key]
                print(f"  snip_{key}: a cycle {ad['cycle_ms']:.0f} ms = "
                      f"{ad['cycle_step_equivalents']:.1f} steps, every {ad['every']}: "
                      f"{ad['amortized_vs_fp32']:.2f}x fp32 averaged over a period "
                      f"(FP4 FLOPs {ad['fp4_flop_fraction']:.2f})", flush=True)
            if args.compile:
                run["compiled"][name] = bench_compiled(name, rounds, warmup)
                print_table(f"{name} compiled, {threads} thread(s)",
                            run["compiled"][name]["arms"])
        results["runs"][str(threads)] = run
    results["loadavg_after"] = os.getloadavg()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
