"""``snip audit``: record (or read) an fp32 reference trace and audit low-precision write-back.

1. Reference: train ``--model`` in fp32 for ``--steps`` steps on the built-in byte corpus (AdamW
   + cosine), recording the trace (:class:`snip.audit.ReferenceTrace`), or read ``--trace FILE``.
2. Measured (unless ``--no-measure``): re-run the same init and data order with the weights
   stored on each ``--formats`` grid under direct write-back (``--policy``, default ``rne``),
   recording the exact invisible-update event.
3. Outputs in ``--out``: ``trace.npz``, ``frozen_<fmt>.png`` (measured vs projected frozen
   fraction over time, one panel per tensor plus the total), ``summary.json`` (first-majority
   crossings predicted vs measured, never-moved fractions, rho), and with ``--mask-out FILE`` an
   exact-budget fp32-master tile mask for ``snip train --writeback.mask FILE``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from snip.errors import UserError

COMMAND = "audit"
HELP = "audit invisible weight updates against an fp32 reference trace; build fp32-master masks"

MASK_METHODS = ("reference", "freeze_only", "random", "layers")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--trace", help="read this reference trace (.npz) instead of recording one")
    a("--out", default="runs/audit", help="output directory")
    a("--model", default="tiny", help="snip.models size to train (tiny, small)")
    a("--steps", type=int, default=200, help="training steps of the reference (and measured) run")
    a("--batch", type=int, default=16, help="sequences per step")
    a("--seq-len", type=int, default=64, help="tokens per sequence")
    a("--lr", type=float, default=1e-3, help="peak AdamW learning rate (cosine to 10 %%)")
    a("--weight-decay", type=float, default=0.1, help="AdamW weight decay")
    a("--seed", type=int, default=0, help="init and data-order seed")
    a("--formats", nargs="+", default=["e4m3", "e5m2"],
      help="target element formats (scale-1 grids); a read trace keeps its own")
    a("--tile-size", type=int, default=768, help="coordinates per tile (flattened row-major)")
    a("--score-steps", type=int, default=0, help="steps averaged for tile scores (0: all)")
    a("--every", type=int, default=1, help="record every k steps")
    a("--tiles", action="store_true", help="also record per-tile projected frozen fractions")
    a("--policy", default="rne", choices=["rne", "stochastic"], help="measured-run write-back")
    a("--no-measure", action="store_true", help="skip the measured low-precision runs")
    a("--mask-out", help="write an exact-budget fp32-master tile mask (JSON) here")
    a("--mask-fraction", type=float, default=0.1, help="mask budget: fraction of the payload")
    a("--mask-method", default="reference", choices=MASK_METHODS, help="mask ranking")
    a("--threads", type=int, default=0, help="torch CPU threads (0: torch default)")


def _settings(args: argparse.Namespace) -> dict:
    keys = ("model", "steps", "batch", "seq_len", "lr", "weight_decay", "seed")
    return {k: getattr(args, k) for k in keys}


def _train_section(cfg: dict):
    """The trainer's settings for ``cfg``: its AdamW (betas 0.9/0.95, no decay on norms and
    embeddings) and schedule (warm-up over 5 % of the steps, cosine to 10 %)."""
    from snip.train.config import TrainSection

    return TrainSection(steps=cfg["steps"], batch_size=cfg["batch"], seq_len=cfg["seq_len"],
                        lr=cfg["lr"], weight_decay=cfg["weight_decay"], min_lr_ratio=0.1,
                        warmup_steps=max(1, cfg["steps"] // 20), beta1=0.9, beta2=0.95)


def _run(cfg: dict, ds, *, fmt: str | None = None, policy: str = "rne",
         recorder_kw: dict | None = None, tile_size: int = 768):
    """fp32 reference (fmt None, with a recorder) or a measured low-precision run."""
    import torch

    from snip.audit import ReferenceRecorder
    from snip.models import build_model
    from snip.optim import WritebackOptimizer, eligible_parameters
    from snip.train.loop import lr_at, make_optimizer

    torch.manual_seed(cfg["seed"])
    model = build_model(cfg["model"])
    if cfg["seq_len"] > model.config.max_seq_len:
        raise UserError(f"--seq-len {cfg['seq_len']} exceeds the {cfg['model']} model's "
                        f"max_seq_len {model.config.max_seq_len}")
    t = _train_section(cfg)
    opt = make_optimizer(model, t)
    named = eligible_parameters(model)
    stepper = (ReferenceRecorder(named, **recorder_kw) if fmt is None else
               WritebackOptimizer(opt, named, element=fmt, policy=policy, seed=cfg["seed"],
                                  tile_size=tile_size, record_every=recorder_kw["every"],
                                  record_tiles=recorder_kw["tiles"]))
    for step in range(cfg["steps"]):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, t)
        x, y = ds.get_batch("train", cfg["batch"], cfg["seq_len"], step=step)
        opt.zero_grad(set_to_none=True)
        model(x, y)[1].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        stepper.step(opt) if fmt is None else stepper.step()
    return stepper


def _plot(trace, fmt: str, measured, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from snip.audit import measured_series

    names = [None] + trace.names
    cols = 4
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.6 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        ax.plot(trace.steps, trace.projected(fmt, name), label="projected (fp32 trace)")
        if measured is not None:
            st, f = measured_series(measured.history, name)
            ax.plot(st, f, label="measured (exact event)", linestyle="--")
        ax.axhline(0.5, color="grey", linewidth=0.5)
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(name or "all eligible weights", fontsize=8)
        ax.set_xlabel("step", fontsize=7)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"frozen fraction, {fmt} analytic grid")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _format_summary(trace, fmt: str, measured) -> dict:
    from snip.audit import (
        compare_crossings,
        first_crossing,
        freeze_probability,
        measured_series,
        rho,
    )

    out: dict = {"projected_first_majority": first_crossing(trace.steps, trace.projected(fmt))}
    n = trace.norms
    r0 = [rho(n[k][0, 1], n[k][0, 0], fmt) for k in trace.names] if len(trace.steps) else []
    out["rho_first_step"] = dict(zip(trace.names, r0, strict=True))
    out["rho_freeze_probability_first_step"] = {k: freeze_probability(v)
                                                for k, v in out["rho_first_step"].items()}
    if measured is not None:
        st, f = measured_series(measured.history)
        out["forecast_total"] = compare_crossings(trace.steps, trace.projected(fmt), st, f)
        out["forecast_per_tensor"] = {
            k: compare_crossings(trace.steps, trace.projected(fmt, k),
                                 *measured_series(measured.history, k))
            for k in trace.names}
        out["never_moved"] = measured.never_moved()
    return out


def _mask(trace, method: str, fraction: float, fmt: str):
    from snip.audit import freeze_only_mask, layer_mask, random_mask, reference_mask

    if method == "reference":
        return reference_mask(trace, fraction)
    if method == "freeze_only":
        return freeze_only_mask(trace, fmt, fraction)
    if method == "random":
        return random_mask(trace.shapes, fraction, tile_size=trace.tile_size)
    return layer_mask(trace.shapes, fraction, tile_size=trace.tile_size)


def run(args: argparse.Namespace) -> int:
    import torch

    from snip.audit import ReferenceTrace
    from snip.data import load_dataset

    if args.threads:
        torch.set_num_threads(args.threads)
    rec_kw = {"formats": args.formats, "tile_size": args.tile_size,
              "score_steps": args.score_steps, "every": args.every, "tiles": args.tiles}
    trace = ReferenceTrace.load(args.trace) if args.trace else None  # bad file: nothing written
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = (trace.meta.get("settings") if trace else None) or _settings(args)
    ds = load_dataset() if trace is None or not args.no_measure else None
    if trace is None:
        trace = _run(cfg, ds, recorder_kw=rec_kw).trace(meta={"settings": cfg})
    trace.save(out / "trace.npz")
    summary = {"settings": cfg, "formats": {}}
    for fmt in trace.formats:
        measured = None if args.no_measure else _run(cfg, ds, fmt=fmt, policy=args.policy,
                                                      recorder_kw=rec_kw,
                                                      tile_size=trace.tile_size)
        _plot(trace, fmt, measured, out / f"frozen_{fmt}.png")
        summary["formats"][fmt] = _format_summary(trace, fmt, measured)
    if args.mask_out:
        mask = _mask(trace, args.mask_method, args.mask_fraction, trace.formats[0])
        mask.save(args.mask_out)
        summary["mask"] = {"path": args.mask_out, "method": mask.method,
                           "protected": mask.protected, "eligible": mask.eligible}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    for fmt, s in summary["formats"].items():
        f = s.get("forecast_total", {})
        print(f"{fmt}: first-majority crossing projected {s['projected_first_majority']}, "
              f"measured {f.get('measured', 'n/a')}")
    print(f"wrote {out}/summary.json, trace.npz and frozen_*.png")
    return 0
