"""``snip audit``: record (or read) an fp32 reference trace and audit low-precision write-back.

1. Reference: train ``--model.name`` in fp32 for ``--train.steps`` steps on the built-in byte
   corpus (AdamW + cosine), recording the trace (:class:`snip.audit.ReferenceTrace`), or read
   ``--trace FILE``.
2. Measured (unless ``--no-measure``): re-run the same init and data order with the weights
   stored on each ``--formats`` grid under direct write-back (``--policy``, default ``rne``),
   recording the exact invisible-update event.
3. Every output lands in ``--out``: ``trace.npz``, ``frozen_<fmt>.png`` (predicted vs measured
   frozen fraction over time, one panel per tensor type plus the total), ``summary.json``
   (first-majority crossings predicted vs measured, never-moved fractions, rho), the run
   directories of the reference and measured runs, and with ``--mask-out NAME`` an exact-budget
   fp32-master tile mask ``--out/NAME`` for ``snip train --writeback.mask``.  The last line
   printed names every file written.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from snip.errors import UserError

COMMAND = "audit"
HELP = "audit invisible weight updates against an fp32 reference trace; build fp32-master masks"

MASK_METHODS = ("reference", "freeze_only", "random", "matched_random", "layers")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--trace", help="read this reference trace (.npz) instead of recording one")
    a("--out", default="runs/audit", help="output directory")
    a("--run", metavar="RUN_OR_CHECKPOINT",
      help="audit with a run's own settings (model, data, optimizer, schedule, precision, seed; "
           "--model.name, --train.batch_size, --train.seq_len, --train.lr, "
           "--train.weight_decay and --seed are then ignored): from scratch for a run directory, "
           "or continuing from a checkpoint of it")
    a("--model", default="tiny", help="snip.models size to train (tiny, small)")
    a("--steps", type=int, default=None,
      help="training steps of the reference (and measured) run (default: 200; with --run, the "
           "run's own steps, or from a checkpoint the rest of its schedule)")
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
    a("--mask-out", metavar="NAME",
      help="also write an exact-budget fp32-master tile mask (JSON) as --out/NAME (a file name, "
           "e.g. mask.json)")
    a("--mask-fraction", type=float, default=0.1, help="mask budget: fraction of the payload")
    a("--mask-method", default="reference", choices=MASK_METHODS, help="mask ranking")
    a("--threads", type=int, default=0, help="torch CPU threads (0: torch default)")


def _settings(args: argparse.Namespace) -> dict:
    if args.run:
        return {"run": str(Path(args.run).resolve()), "steps": args.steps}
    keys = ("model", "batch", "seq_len", "lr", "weight_decay", "seed")
    return {**{k: getattr(args, k) for k in keys},
            "steps": 200 if args.steps is None else args.steps}


def _check_numbers(args: argparse.Namespace) -> None:
    """The audit's own numbers, before anything trains or is written."""
    for flag, value, low in (("--train.steps", args.steps, 1), ("--tile-size", args.tile_size, 1),
                             ("--every", args.every, 1), ("--score-steps", args.score_steps, 0)):
        if value is not None and value < low:
            raise UserError(f"{flag} {value} must be >= {low}")
    if not 0 <= args.mask_fraction <= 1:
        raise UserError(f"--mask-fraction {args.mask_fraction} must lie in [0, 1]")


def _check_cadence(cfg: dict, out: Path, every: int) -> None:
    """``--every`` within the steps the runs will train (else the trace would hold none)."""
    cfg_run, _, start = _config(cfg, {"run.dir": str(out), "run.name": "reference"})
    steps = cfg_run.train.steps - start
    if steps < 1:
        raise UserError(f"--run {cfg['run']} is at the end of its schedule: nothing to audit; "
                        "pass --train.steps N to continue it N steps")
    if every > steps:
        raise UserError(f"--every {every} is more than the {steps} steps the audit trains: "
                        "its trace would record no step; lower --every")


class Interrupted(Exception):
    """An audit run stopped by Ctrl-C or SIGTERM: the audit ends there, summarizing nothing."""


def _config(cfg: dict, values: dict):
    """The trainer config of an audit run, the checkpoint it branches from (or None) and that
    checkpoint's step (0: from scratch)."""
    from snip.train import checkpoint, from_sources

    if "run" not in cfg:  # the audit's own settings on the embedded corpus
        steps = cfg["steps"]
        base = {"model.name": cfg["model"], "train.steps": steps,
                "train.batch_size": cfg["batch"], "train.seq_len": cfg["seq_len"],
                "train.lr": cfg["lr"], "train.weight_decay": cfg["weight_decay"],
                "train.warmup_steps": max(1, steps // 20), "train.min_lr_ratio": 0.1,
                "seed": cfg["seed"], "precision.preset": "fp32"}
        return from_sources(overrides={**base, **_cadence(steps), **values}), None, 0
    source = Path(cfg["run"])
    if (source / "meta.json").is_file():  # a checkpoint: continue its run from there
        ckpt = checkpoint.find(source, "--run")
        step = int(checkpoint.verify(ckpt)["step"])
        saved = from_sources(overrides={"run.name": "probe"}, init_from=ckpt)
        total = step + cfg["steps"] if cfg["steps"] else saved.train.steps
        over = {**_cadence(total), "train.steps": total, **values}
        return from_sources(overrides=over, init_from=ckpt), ckpt, step
    if not (source / "config.toml").is_file():
        raise UserError(f"--run {source} is neither a run directory (no config.toml) nor a "
                        "checkpoint")
    steps = cfg["steps"] or from_sources(source / "config.toml").train.steps
    over = {**_cadence(steps), "train.steps": steps, **values}
    return from_sources(source / "config.toml", overrides=over), None, 0


def _cadence(steps: int) -> dict:
    return {"train.eval_every": steps, "train.ckpt_every": steps, "train.keep_checkpoints": 1}


def _run(cfg: dict, out: Path, *, fmt: str | None = None, policy: str = "rne",
         recorder_kw: dict | None = None, tile_size: int = 768, threads: int = 0):
    """The fp32 reference (fmt None: returns its `ReferenceRecorder`) or a measured run with the
    weights stored on the ``fmt`` grid (returns the `WritebackOptimizer`, whose history holds
    the exact invisible-update records), with the run's validation loss. Both are trained by the
    one trainer (`snip.train`), with the audit's own settings (AdamW betas 0.9/0.95, no decay on
    norms and embeddings, warm-up over 5 % of the steps, cosine to 10 %, embedded corpus) or a
    run's (``--run``); each is an ordinary run directory under ``out``."""
    from snip.audit import ReferenceRecorder
    from snip.optim import eligible_parameters
    from snip.train.hooks import RecorderHook
    from snip.train.loop import Trainer

    name = _run_name(fmt)
    _clear_own_run(out / name)
    (out / name).mkdir(parents=True, exist_ok=True)
    (out / name / MARKER).write_text("written by snip audit; a later snip audit --out may "
                                     "replace this run directory\n")
    values = {"log.every": recorder_kw["every"], "run.dir": str(out), "run.name": name,
              "writeback.policy": "none" if fmt is None else policy,
              "writeback.mask": "", "writeback.state_format": ""}
    if fmt is not None:
        values |= {"writeback.format": fmt, "writeback.tile_size": tile_size}
    if threads:
        values["train.threads"] = threads
    cfg_run, ckpt, _ = _config(cfg, values)
    trainer = Trainer(cfg_run, init_from=ckpt, bf16_note=False)  # (audit has no accum flag)
    try:
        if fmt is None:
            recorder = ReferenceRecorder(eligible_parameters(trainer.model), **recorder_kw)
            trainer.hooks.append(RecorderHook(recorder))
        else:
            trainer.writeback.keep_history = True
            trainer.writeback.wb.record_tiles = recorder_kw["tiles"]
        result = trainer.run()
    finally:
        trainer.close()
    if result.interrupted:  # its runs would not compare (one of them cut short)
        raise Interrupted(str(out / name))
    return (recorder if fmt is None else trainer.writeback.wb), result.val_loss


MARKER = ".snip-audit"  # in every run directory snip audit creates: its own to replace


def _run_name(fmt: str | None) -> str:
    return "reference" if fmt is None else f"measured_{fmt}"


def _check_run_dirs(out: Path, names: list[str]) -> None:
    """Before anything trains: every run directory the audit will write is free, or its own
    from an earlier call (never someone's training run)."""
    for name in names:
        d = out / name
        if not d.exists():
            continue
        if not d.is_dir():
            raise UserError(f"{d} is a file; snip audit writes a run directory there: choose "
                            "another --out")
        if any(not p.name.startswith(".") for p in d.iterdir()) and not (d / MARKER).is_file():
            raise UserError(f"{d} holds files snip audit did not write (a training run?); it "
                            "is left alone: choose another --out")


def _clear_own_run(run_dir: Path) -> None:
    """Remove the audit's own run from an earlier call, holding the run's lock (a run that is
    training is refused, not destroyed)."""
    import shutil

    from snip.train.rundir import RunLock

    if not (run_dir / MARKER).is_file():
        _check_run_dirs(run_dir.parent, [run_dir.name])
        return
    with RunLock(run_dir):
        for p in run_dir.iterdir():
            if p.name == ".lock":
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()


def _plot(trace, fmt: str, measured, path: Path) -> None:
    """One panel for all eligible weights, then one per tensor type (all layers' ``wq`` in one
    numel-weighted curve, ...): predicted (from the fp32 trace, dashed) vs measured (solid)
    frozen fraction, first-majority crossings ticked (:func:`snip.audit.plot_frozen_by_type`)."""
    from snip.audit import by_type, measured_series, plot_frozen_by_type

    numel = {n: math.prod(trace.shapes[n]) for n in trace.names}
    pred = (trace.steps, by_type({n: trace.projected(fmt, n) for n in trace.names}, numel))
    meas = None
    if measured is not None:
        per = {n: measured_series(measured.history, n) for n in trace.names}
        steps = next(iter(per.values()))[0]
        meas = (steps, by_type({n: f for n, (_, f) in per.items()}, numel))
    plot_frozen_by_type(pred, meas, path,
                        title=f"frozen fraction, {fmt} analytic grid, by tensor type")


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
    from snip.audit import (
        freeze_only_mask,
        layer_mask,
        matched_random_mask,
        random_mask,
        reference_mask,
    )

    if method == "reference":
        return reference_mask(trace, fraction)
    if method == "matched_random":  # the reference mask's per-tensor counts, random tiles
        return matched_random_mask(reference_mask(trace, fraction))
    if method == "freeze_only":
        return freeze_only_mask(trace, fmt, fraction)
    if method == "random":
        return random_mask(trace.shapes, fraction, tile_size=trace.tile_size)
    return layer_mask(trace.shapes, fraction, tile_size=trace.tile_size)


def _mask_name(value: str | None) -> str | None:
    """The mask's file name under ``--out``: a bare name, so that every output stays there."""
    if value is None:
        return None
    name = Path(value).name
    if not name or name != value or name in (".", ".."):
        raise UserError(f"--mask-out takes a file name, written under --out (got {value!r}); "
                        f"choose the directory with --out, e.g. --out DIR --mask-out mask.json")
    return name


def run(args: argparse.Namespace) -> int:
    from snip import atomic
    from snip.audit import ReferenceTrace
    from snip.formats import get_element
    from snip.train.rundir import RunLock

    mask_name = _mask_name(args.mask_out)  # a bad name: nothing written
    _check_numbers(args)
    # an unknown format: nothing written (the recorder would refuse it after the reference
    # run had started); names as the runs will be called (``E4M3`` -> ``measured_e4m3``)
    fmts = [get_element(f).name for f in args.formats]
    rec_kw = {"formats": fmts, "tile_size": args.tile_size,
              "score_steps": args.score_steps, "every": args.every, "tiles": args.tiles}
    trace = ReferenceTrace.load(args.trace) if args.trace else None  # bad file: nothing written
    out = Path(args.out)
    atomic.check_outside(out, "--out")  # (its own earlier --out holds runs, but is none)
    formats = trace.formats if trace is not None else fmts
    _check_run_dirs(out, [*([] if trace else [_run_name(None)]),
                          *([] if args.no_measure else [_run_name(f) for f in formats])])
    cfg = (trace.meta.get("settings") if trace else None) or _settings(args)
    if trace is None:
        _check_cadence(cfg, out, args.every)
    earlier = _earlier_outputs(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise atomic.write_error(e, out) from None
    with RunLock(out, "--out"):  # one audit at a time writes into --out
        try:
            return _audit(args, out, trace, cfg, rec_kw, mask_name, earlier)
        except Interrupted as stopped:
            print(f"snip audit: interrupted in {stopped}; nothing summarized (its checkpoint "
                  "is saved; rerun the audit to replace its runs)", file=sys.stderr)
            return 130


def _audit(args: argparse.Namespace, out: Path, trace, cfg: dict, rec_kw: dict,
           mask_name: str | None, earlier: list[str]) -> int:
    """The runs, the trace, the plots, the mask and the summary, under ``out``'s lock."""
    val: dict[str, float] = {}
    runs: list[str] = []  # the run directories this audit trains
    if trace is None:
        recorder, val["fp32"] = _run(cfg, out, recorder_kw=rec_kw, threads=args.threads)
        runs.append(_run_name(None))
        trace = recorder.trace(meta={"settings": cfg, "val_loss": val["fp32"]})
    elif "val_loss" in trace.meta:
        val["fp32"] = trace.meta["val_loss"]
    trace.save(out / "trace.npz")
    summary = {"settings": cfg, "formats": {}, "val_loss": val}
    for fmt in trace.formats:
        measured = None
        if not args.no_measure:
            measured, val[fmt] = _run(cfg, out, fmt=fmt, policy=args.policy, recorder_kw=rec_kw,
                                      tile_size=trace.tile_size, threads=args.threads)
            runs.append(_run_name(fmt))
        _plot(trace, fmt, measured, out / f"frozen_{fmt}.png")
        summary["formats"][fmt] = _format_summary(trace, fmt, measured)
    written = ["summary.json", "trace.npz", *(f"frozen_{f}.png" for f in trace.formats)]
    if mask_name:
        mask = _mask(trace, args.mask_method, args.mask_fraction, trace.formats[0])
        mask.save(out / mask_name)
        summary["mask"] = {"path": str(out / mask_name), "method": mask.method,
                           "protected": mask.protected, "eligible": mask.eligible}
        written.append(mask_name)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    for fmt, s in summary["formats"].items():
        print(_plain(fmt, args.policy, s, val, trace.shapes))
    own = [*written, *(f"{d}/" for d in runs)]
    stale = [n for n in earlier if n not in own and (out / n).exists()]
    if stale:  # kept (a training run may name the old mask), but not passed off as this one's
        shown = (str(out / n.rstrip("/")) + ("/" if n.endswith("/") else "") for n in stale)
        print(f"note: {', '.join(shown)} left from an earlier audit in {out} (not this "
              "one's outputs)")
    print(f"wrote {', '.join(str(out / w) for w in written)}"
          + (f"; run directories {', '.join(str(out / d) + '/' for d in runs)}" if runs else ""))
    return 0


def _earlier_outputs(out: Path) -> list[str]:
    """What an earlier audit into ``out`` wrote besides what every audit rewrites: its mask,
    its formats' plots and measured runs (``measured_e5m2/``), from its ``summary.json``."""
    try:
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(summary, dict):
        return []
    formats = summary.get("formats") or {}
    names = [*(f"frozen_{f}.png" for f in formats), "reference/",
             *(f"measured_{f}/" for f in formats)]
    mask = summary.get("mask")
    if isinstance(mask, dict) and isinstance(mask.get("path"), str):
        names.append(Path(mask["path"]).name)
    return names


def _plain(fmt: str, policy: str, s: dict, val: dict[str, float], shapes: dict) -> str:
    """One sentence a user can act on, e.g. "e4m3, round to nearest: 81% of weights never
    moved; majority frozen from step 1 (forecast: step 1); validation loss fp32 2.30 vs e4m3
    3.95"."""
    how = {"rne": "round to nearest", "stochastic": "stochastic rounding"}.get(policy, policy)
    parts = []
    if "never_moved" in s:
        numel = {n: math.prod(shape) for n, shape in shapes.items()}
        nm = sum(s["never_moved"][n] * numel[n] for n in numel) / sum(numel.values())
        parts.append(f"{100 * nm:.0f}% of weights never moved")
    measured = s.get("forecast_total", {}).get("measured")
    forecast = s["projected_first_majority"]
    parts.append(f"majority frozen from step {measured} (forecast: step {forecast})"
                 if measured is not None else
                 f"majority frozen: {'never' if forecast is None else f'from step {forecast}'}"
                 f" (forecast{'; not measured' if 'never_moved' not in s else ''})")
    if "fp32" in val and fmt in val:
        parts.append(f"validation loss fp32 {val['fp32']:.2f} vs {fmt} {val[fmt]:.2f}")
    return f"{fmt}, {how}: " + "; ".join(parts)
