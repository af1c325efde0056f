"""`snip train` end to end against a minimal plain-PyTorch loop on the same batches (issue 21).

What a user pays for the trainer itself -- logging, validation and checkpoints at their default
cadence (`log.every` 10, `train.eval_every` 50 with 8 batches, `train.ckpt_every` 100), the run
directory, the progress lines and, by default, SNIP's statistics cycles and re-planning -- on
top of the GEMMs it emulates.  Every arm trains the same model from the same seed for the same
steps on the same batches (`Batches.train_batch(step)`), timed as a whole call (set-up
included: model build, the cached corpus opened, the run directory):

* ``loop_plain``: a minimal loop -- AdamW, gradient clipping at 1.0, nothing else -- on the plain
  model (no `snip.convert`);
* ``loop_<preset>``: the same loop on the model converted to the preset;
* ``train_<preset>``: `snip train --precision.mode fixed --precision.preset <preset>` (the
  library's `train`, what the command runs), defaults otherwise;
* ``loop_<preset>@auto``, ``train_<preset>@auto`` (a preset given as ``mxfp4@auto``): the same
  with ``accum="auto"`` (`--precision.accum auto`: bf16 GEMMs where the CPU has them);
* ``train_default``: `snip train` with every default (adaptive SNIP re-planning every 100
  steps at 75 % FP4), the whole default run.

The trainer's overhead is ``train_<preset> / loop_<preset>`` (target <= 1.2); what emulation
adds is ``loop_<preset> / loop_plain``.  Arms run interleaved in rounds in one process; figures
are medians over rounds of the per-round ratio to ``loop_plain``.  Raw times, CPU model and
flags go to ``--out`` (default ``benchmarks/results/issue21/bench_train_e2e_t<threads>.json``).

    PYTHONPATH=src python benchmarks/bench_train_e2e.py --threads 1 --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from snip.models import build_model, get_config
from snip.nn import convert
from snip.train import from_sources, train
from snip.train.batches import open_data

try:
    from benchmarks._util import cpu_info, preset_and_accum
except ImportError:  # run as a script from the benchmarks directory
    from _util import cpu_info, preset_and_accum

RESULTS = Path(__file__).parent / "results" / "issue21"


def loop_model(cfg, preset: str | None) -> torch.nn.Module:
    """The model `snip train` builds for ``cfg`` (same seed), converted to ``preset`` (a preset
    name, ``@auto`` for ``accum="auto"``) as `snip train --precision.mode fixed` would."""
    torch.manual_seed(cfg.seed)
    model = build_model(get_config(cfg.model.name))
    if preset is not None:
        name, accum = preset_and_accum(preset)
        convert(model, name, accum=accum)
    return model


def minimal_loop(overrides: dict, preset: str | None) -> float:
    """The loop a user would write by hand: same model, seed, batches and steps as `snip train`
    with ``overrides``; returns the last loss."""
    cfg = from_sources(overrides=overrides)
    t = cfg.train
    model = loop_model(cfg, preset)
    data = open_data(cfg.data, cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=t.lr, betas=(t.beta1, t.beta2),
                            weight_decay=t.weight_decay)
    loss = torch.tensor(math.nan)
    for step in range(t.steps):
        x, y = data.train_batch(step, t.batch_size, t.seq_len)
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return loss.item()


def snip_train(overrides: dict) -> float:
    with contextlib.redirect_stdout(io.StringIO()):
        return train(from_sources(overrides=overrides)).train_loss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--steps", type=int, default=250, help="optimizer steps (snip train's default)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--presets", default="fp32,bf16,mxfp4",
                    help="comma-separated presets for the loop_/train_ pairs (`mxfp4@auto`: "
                         "with --precision.accum auto)")
    ap.add_argument("--out", type=Path, default=None,
                    help="the JSON (default: results/issue21/bench_train_e2e_t<threads>.json)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    presets = args.presets.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        base = {"model.name": args.model, "train.steps": args.steps,
                "train.threads": args.threads, "log.progress": False, "run.dir": tmp}
        counter = iter(range(10**6))

        def run_of(extra: dict) -> dict:
            return {**base, **extra, "run.name": f"r{next(counter)}"}

        arms: dict[str, Callable[[], float]] = {"loop_plain": lambda: minimal_loop(base, None)}
        for p in presets:
            name, accum = preset_and_accum(p)
            fixed = {"precision.mode": "fixed", "precision.preset": name, "precision.accum": accum}
            arms[f"loop_{p}"] = lambda p=p: minimal_loop(base, p)
            arms[f"train_{p}"] = lambda fixed=fixed: snip_train(run_of(fixed))
        arms["train_default"] = lambda: snip_train(run_of({}))
        minimal_loop({**base, "train.steps": 2}, None)  # warm: corpus cache, kernels
        snip_train(run_of({"train.steps": 2, "precision.mode": "fixed",
                           "precision.preset": "mxfp4"}))
        times: dict[str, list[float]] = {a: [] for a in arms}
        losses: dict[str, list[float]] = {a: [] for a in arms}
        load = [list(__import__("os").getloadavg())]
        for r in range(args.rounds):
            for name, fn in arms.items():
                t0 = time.perf_counter()
                losses[name].append(fn())
                times[name].append(time.perf_counter() - t0)
                print(f"round {r + 1} {name}: {times[name][-1]:.1f} s", file=sys.stderr)
        load.append(list(__import__("os").getloadavg()))
    cfg = from_sources(overrides=base)
    tokens = args.steps * cfg.train.batch_size * cfg.train.seq_len

    def median_ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))

    summary = {name: {"tok_s": round(tokens / statistics.median(ts)),
                      "vs_loop_plain": round(median_ratio(name, "loop_plain"), 3)}
               for name, ts in times.items()}
    for p in presets:
        summary[f"train_{p}"]["vs_loop_same_preset"] = round(
            median_ratio(f"train_{p}", f"loop_{p}"), 3)
    args_json = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    out = {"args": args_json, "tokens_per_run": tokens, "cpu": cpu_info(),
           "loadavg_before_after": load, "seconds": times, "final_losses": losses,
           "summary": summary}
    path = args.out or RESULTS / f"bench_train_e2e_t{args.threads}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{'arm':<16} {'tok/s':>8} {'vs loop_plain':>13} {'vs its loop':>12}")
    for name, s in summary.items():
        print(f"{name:<16} {s['tok_s']:>8} {s['vs_loop_plain']:>13.3f} "
              f"{s.get('vs_loop_same_preset', float('nan')):>12.3f}")
    print(f"raw: {path}")


if __name__ == "__main__":
    main()
