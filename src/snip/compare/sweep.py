"""A comparison sweep: every arm branched from every base checkpoint under every data order.

    sweep = Sweep(bases=("runs/bf16/checkpoints/step_000400",), arms=parse_arms([...]),
                  steps=200, orders=2, reference="bf16", out="runs/cmp")
    run_sweep(sweep)            # trains what is missing, then writes the summary
    summarize(Path("runs/cmp")) # the paired statistics of what has finished

A *unit* is one (base, order) pair. In a unit every arm is a branch (``snip train --init-from``)
of the same checkpoint -- same weights, AdamW state and step -- that trains ``steps`` more steps
on the same batches (order 0: the parent's own batch order; order k: the parent's order seed
plus k) and is evaluated on the same strided validation windows at its end, with its plan and in
high precision (`snip.train.evaluation`). So arms differ only in their precision, and the
per-unit difference to the reference arm is a paired measurement (`snip.compare.stats`).

Everything lives under ``out``::

    sweep.json                      the sweep's definition (``--resume OUT`` reads it back)
    runs/b<i>_o<k>/<arm>/           one ordinary run directory per (unit, arm) (Arm.dirname)
    runs/b<i>_o<k>/<arm>/result.json   its final numbers, written when the arm finishes
    compare.json, compare.md        the statistics (JSON and a Markdown table)
    report.html                     the table and the loss curves of all arms (base 0, order 0)

Every branch's config and starting plan is checked before the first one trains, and
``sweep.json`` is written only then. An arm with a ``result.json`` is never trained again; one
that was interrupted (Ctrl-C saves a checkpoint) is resumed; one whose final checkpoint exists
but whose result does not (killed between the two) is evaluated from that checkpoint -- a
result is never NaN. A sweep killed at any moment continues where it stopped, and a sweep
directory that was moved resumes from where it is now.

Several workers may run one sweep at once (``snip compare --resume OUT`` in another process):
each branch is claimed first (``.claim`` in its run directory, created atomically, names the
worker by host, boot id, PID and process start time; its mtime is a heartbeat refreshed while
the branch trains). A claim whose worker is gone -- dead, its PID reused by another process or
after a reboot, or, from another machine, silent for `STALE_AFTER` -- is taken over; a worker
skips branches another live worker holds, and a sweep that ends with such rows missing returns
`Outcome.INCOMPLETE` (``snip compare`` exits 3).
"""

from __future__ import annotations

import contextlib
import enum
import json
import math
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from snip import atomic, jsonfile
from snip.atomic import pid_alive
from snip.compare.arms import Arm, Kind
from snip.compare.halves import half_losses
from snip.compare.stats import (
    HypothesisResult,
    HypothesisSpec,
    Paired,
    evaluate_hypotheses,
    gap_closed,
    paired,
    percentile_among,
)
from snip.errors import UserError

SWEEP_FILE, RESULT_FILE, CLAIM_FILE = "sweep.json", "result.json", ".claim"
HYPOTHESES_FILE = "hypotheses.json"  # {"delta_min": nats, "hypotheses": [...]} (optional)
METRICS = ("val_loss_hp", "val_loss")  # high precision first: the primary comparison


@dataclass(frozen=True, kw_only=True)
class Sweep:
    """The definition of a comparison (see the module docstring)."""

    bases: tuple[str, ...]
    arms: tuple[Arm, ...]
    steps: int = 200
    orders: int = 1
    reference: str = ""
    gap: str = ""
    eval_batches: int = 32
    candidates: str = ""  # precision.candidates of the adaptive arms ("": the planner's)
    out: str = "runs/compare"
    threads: int = 0

    def __post_init__(self) -> None:
        labels = [a.label for a in self.arms]
        if self.steps < 1 or self.orders < 1 or self.eval_batches < 1:
            raise UserError(f"--steps ({self.steps}), --orders ({self.orders}) and "
                            f"--eval-batches ({self.eval_batches}) must be >= 1")
        if not self.bases:
            raise UserError("give at least one --base checkpoint")
        from snip.train.config import MAX_THREADS

        if not 0 <= self.threads <= MAX_THREADS:
            raise UserError(f"--threads must be in [0, {MAX_THREADS}] (0: the trainer's "
                            f"default), got {self.threads}")
        for name, label in (("--reference", self.reference), ("--gap", self.gap)):
            if label and label not in labels:
                raise UserError(f"{name} {label!r} is not one of the arms: {', '.join(labels)}")

    @property
    def units(self) -> list[tuple[int, int]]:
        return [(b, o) for b in range(len(self.bases)) for o in range(self.orders)]

    def run_dir(self, unit: tuple[int, int], arm: Arm) -> Path:
        return Path(self.out) / "runs" / f"b{unit[0]}_o{unit[1]}" / arm.dirname

    def to_dict(self) -> dict[str, Any]:
        return {"bases": list(self.bases), "arms": [a.to_dict() for a in self.arms],
                "steps": self.steps, "orders": self.orders, "reference": self.reference,
                "gap": self.gap, "eval_batches": self.eval_batches,
                "candidates": self.candidates}

    @classmethod
    def from_dict(cls, d: dict[str, Any], out: str, threads: int = 0) -> Sweep:
        arms = tuple(Arm(**{**a, "kind": Kind(a["kind"])}) for a in d["arms"])
        return cls(bases=tuple(d["bases"]), arms=arms, steps=d["steps"], orders=d["orders"],
                   reference=d["reference"], gap=d.get("gap", ""),
                   eval_batches=d["eval_batches"], candidates=d.get("candidates", ""),
                   out=out, threads=threads)


def load_sweep(out: Path, threads: int = 0) -> Sweep:
    """The sweep saved in ``out`` (wherever that directory is now)."""
    path = out / SWEEP_FILE
    if not path.is_file():
        raise UserError(f"--resume: {out} holds no comparison ({SWEEP_FILE} is missing)")
    d = _read_definition(path)
    try:
        return Sweep.from_dict(d, str(out), threads)
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, UserError):
            raise
        raise UserError(f"{path} is damaged ({type(e).__name__}: {e})") from None


def _read_definition(path: Path) -> dict[str, Any]:
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{path} is damaged ({type(e).__name__}); restore it or start the "
                        "comparison in another --out") from None
    if not isinstance(d, dict) or not isinstance(d.get("arms"), list):
        raise UserError(f"{path} is damaged (not a comparison definition)")
    return d


# ---------------------------------------------------------------------------------------------
# Running


@dataclass(frozen=True)
class BaseInfo:
    """What a base checkpoint fixes for its branches."""

    path: Path
    step: int
    order_seed: int
    model: dict[str, Any]


def _base_info(path: str) -> BaseInfo:
    from snip.train import checkpoint
    from snip.train.config import build, read_toml_text
    from snip.train.loop import order_seed

    ckpt_dir = checkpoint.find(Path(path), "--base")
    meta = checkpoint.verify(ckpt_dir)
    cfg = build(read_toml_text((ckpt_dir / "config.toml").read_text()))
    return BaseInfo(path=ckpt_dir.resolve(), step=int(meta["step"]), order_seed=order_seed(cfg),
                    model=meta.get("model", {}))


def check_bases(bases: Sequence[str]) -> list[BaseInfo]:
    """Every base is a checkpoint, and all hold models of one shape."""
    infos = [_base_info(b) for b in bases]
    for info in infos[1:]:
        if info.model != infos[0].model:
            key = next(k for k in info.model if info.model.get(k) != infos[0].model.get(k))
            raise UserError(f"bases hold models of different shapes: {infos[0].path} has "
                            f"{key}={infos[0].model.get(key)}, {info.path} has "
                            f"{key}={info.model.get(key)}")
    return infos


def arm_overrides(sweep: Sweep, base: BaseInfo, unit: tuple[int, int],
                  arm: Arm) -> dict[str, Any]:
    """The ``snip train --init-from`` overrides of one (unit, arm) branch."""
    run_dir = sweep.run_dir(unit, arm)
    values: dict[str, Any] = {
        "run.dir": str(run_dir.parent), "run.name": run_dir.name,
        "train.steps": base.step + sweep.steps, "train.eval_every": sweep.steps,
        "train.ckpt_every": sweep.steps, "train.keep_checkpoints": 1,
        "train.eval_batches": sweep.eval_batches, "log.progress": False,
        **arm.overrides(unit)}
    if unit[1]:  # data order k > 0: the parent's order seed + k
        values["data.order_seed"] = base.order_seed + unit[1]
    if sweep.candidates and arm.kind is Kind.ADAPTIVE:
        values["precision.candidates"] = sweep.candidates
    if sweep.threads:
        values["train.threads"] = sweep.threads
    return values


@dataclass
class Progress:
    """One line per finished arm, with the time left at the pace so far."""

    total: int
    done: int = 0
    trained: int = 0
    seconds: float = 0.0
    echo: Callable[[str], None] = print

    def tick(self, line: str, seconds: float | None) -> None:
        self.done += 1
        if seconds is not None:
            self.trained, self.seconds = self.trained + 1, self.seconds + seconds
        left = self.total - self.done
        eta = f", ~{self.seconds / self.trained * left / 60:.1f} min left" if (
            self.trained and left) else ""
        self.echo(f"[{self.done}/{self.total}] {line}{eta}")


def schedule(sweep: Sweep, arm_major: bool = False) -> list[tuple[tuple[int, int], Arm]]:
    """The order branches train in: unit by unit (every arm of unit 0 first), or with
    ``arm_major`` arm by arm -- single arms in definition order, then the draws of random
    families -- so a sweep cut short leaves whole arms (every unit: fully paired) behind."""
    if not arm_major:
        return [(u, a) for u in sweep.units for a in sweep.arms]
    arms = sorted(sweep.arms, key=lambda a: a.family is not None)
    return [(u, a) for a in arms for u in sweep.units]


class Outcome(enum.Enum):
    """How `run_sweep` ended."""

    FINISHED = "finished"  # every branch has its result
    INTERRUPTED = "interrupted"  # Ctrl-C/SIGTERM: the current branch saved a checkpoint
    INCOMPLETE = "incomplete"  # some branches are still held by other workers

    def __bool__(self) -> bool:  # True only when every row of the table exists
        return self is Outcome.FINISHED


def run_sweep(sweep: Sweep, echo: Callable[[str], None] = print,
              arm_major: bool = False, hypotheses: Path | None = None) -> Outcome:
    """Train every missing (unit, arm) in :func:`schedule` order. Every branch is checked
    (its config, its plan against the model) and the ``hypotheses`` file against the arms
    before the first one trains, and the definition (and the hypotheses, `keep_hypotheses`)
    is saved only then; returns how the sweep ended (truthy when every branch finished)."""
    infos = check_bases(sweep.bases)
    check_branches(sweep, infos)
    if hypotheses is not None:
        keep_hypotheses(hypotheses, sweep, write=False)
    _write_definition(sweep)
    if hypotheses is not None:
        keep_hypotheses(hypotheses, sweep)
    progress = Progress(total=len(sweep.units) * len(sweep.arms), echo=echo)
    held: list[str] = []
    for unit, arm in schedule(sweep, arm_major):
        run_dir = sweep.run_dir(unit, arm)
        name = f"b{unit[0]} o{unit[1]} {arm.label}"
        if _finished(run_dir):
            progress.tick(f"{name}: done earlier", None)
            continue
        if not claim(run_dir):
            progress.tick(f"{name}: another worker has it", None)
            held.append(name)
            continue
        t0 = time.perf_counter()
        try:
            result = _train_arm(sweep, infos[unit[0]], unit, arm)
        finally:
            release(run_dir)
        if result is None:
            return Outcome.INTERRUPTED
        progress.tick(f"{name}: val loss {result['val_loss']:.4f} (high precision "
                      f"{result['val_loss_hp']:.4f})", time.perf_counter() - t0)
    missing = [f"b{u[0]} o{u[1]} {a.label}" for u, a in schedule(sweep, arm_major)
               if not _finished(sweep.run_dir(u, a))]
    if missing:
        echo(f"{len(missing)} branch(es) not finished yet (held by another worker): "
             f"{', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''}")
        return Outcome.INCOMPLETE
    return Outcome.FINISHED


def _finished(run_dir: Path) -> bool:
    """Whether the branch in ``run_dir`` has a readable result with finite losses."""
    try:
        record = read_result(run_dir / RESULT_FILE)
    except UserError:
        return False
    return record is not None


def read_result(path: Path) -> dict[str, Any] | None:
    """A branch's result.json (None when there is none); a damaged one is a `UserError`."""
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        if not isinstance(record, dict):
            raise TypeError("not an object")
        for key in (*METRICS, "fp4_flop_fraction"):
            record[key]  # noqa: B018 (present)
        if not all(math.isfinite(record[m]) for m in METRICS):
            raise ValueError("a loss is not finite")
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise UserError(f"{path} is damaged ({type(e).__name__}: {e}); delete it and run "
                        f"snip compare --resume {path.parent.parent.parent.parent} to "
                        "recompute it") from None
    return record


def check_branches(sweep: Sweep, infos: Sequence[BaseInfo]) -> None:
    """Every branch's config builds (candidates, presets, plan files) and its starting plan
    fits the base model: a `UserError` now, before any arm trains or anything is written."""
    import torch

    from snip.models import ModelConfig, build_model
    from snip.train import from_sources
    from snip.train.precision import initial_plan

    models: dict[int, Any] = {}
    for unit in sweep.units:
        base = infos[unit[0]]
        for arm in sweep.arms:
            try:
                cfg = from_sources(overrides=arm_overrides(sweep, base, unit, arm),
                                   init_from=base.path)
            except UserError as e:
                raise UserError(f"arm {arm.label}: {e}") from None
            if id(base) not in models and base.model:
                with torch.device("meta"):  # shapes only, no memory
                    models[id(base)] = build_model(ModelConfig(**base.model))
            if id(base) in models:
                try:
                    initial_plan(cfg.precision).resolve(models[id(base)])
                except UserError as e:
                    raise UserError(f"arm {arm.label}: {e}") from None


HEARTBEAT = 30.0  # seconds between refreshes of a live claim
STALE_AFTER = 1800.0  # a claim from another machine not refreshed for this long is abandoned


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _start_time(pid: int) -> str:
    """The start time of process ``pid`` (clock ticks since boot; "" where unknown)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _identity() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname(), "boot": _boot_id(),
            "start": _start_time(os.getpid())}


def _claim_alive(path: Path) -> bool | None:
    """Whether the claim in ``path`` belongs to a live worker (None: unreadable right now).

    A claim names its worker by host, boot, PID and process start time, so a PID reused after
    a reboot or by another process is not mistaken for the worker; one from another machine
    counts as alive while its heartbeat (the file's mtime) is recent."""
    try:
        text, mtime = path.read_text(), path.stat().st_mtime
    except OSError:
        return None
    try:
        owner = json.loads(text)
        pid = int(owner["pid"])
    except (ValueError, TypeError, KeyError):
        return False  # not a claim this version writes: nobody refreshes it
    me = _identity()
    if owner.get("host") != me["host"]:
        return time.time() - mtime < STALE_AFTER
    if owner.get("boot") != me["boot"] or not pid_alive(pid):
        return False
    return pid == me["pid"] or owner.get("start") == _start_time(pid)


def claim(run_dir: Path) -> bool:
    """Claim a branch for this process; False when another live worker holds it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path, mine = run_dir / CLAIM_FILE, run_dir / f"{CLAIM_FILE}.{os.getpid()}"
    me = _identity()
    mine.write_text(json.dumps(me))
    try:
        for _ in range(2):
            try:
                os.link(mine, path)  # atomic: fails if a claim exists
                return True
            except FileExistsError:
                alive = _claim_alive(path)
                if alive is None:
                    return False  # being removed right now: leave it
                if alive:
                    return _is_mine(path)
                path.unlink(missing_ok=True)  # its worker is gone: take it over
        return False
    finally:
        mine.unlink(missing_ok=True)


def _is_mine(path: Path) -> bool:
    """Whether the claim in ``path`` is this process's (same host, boot and PID)."""
    try:
        owner = json.loads(path.read_text())
        me = _identity()
        return all(owner[k] == me[k] for k in ("pid", "host", "boot"))
    except (OSError, ValueError, TypeError, KeyError):
        return False


def heartbeat(run_dir: Path) -> None:
    """Refresh this process's claim on a branch (its mtime is the heartbeat)."""
    path = run_dir / CLAIM_FILE
    if _is_mine(path):
        with contextlib.suppress(OSError):
            os.utime(path)


def release(run_dir: Path) -> None:
    """Drop this process's claim on a branch (no-op if it holds none)."""
    path = run_dir / CLAIM_FILE
    if _is_mine(path):
        path.unlink(missing_ok=True)


def _write_definition(sweep: Sweep) -> None:
    out = Path(sweep.out)
    path, text = out / SWEEP_FILE, json.dumps(sweep.to_dict(), indent=1) + "\n"
    if path.is_file():
        old = _read_definition(path)
        if old == sweep.to_dict():
            return
        if not extends(old, sweep.to_dict()):
            raise UserError(f"{out} holds another comparison (its {SWEEP_FILE} differs); "
                            f"continue it with snip compare --resume {out}, add arms by "
                            "repeating its definition with more --arm, or choose another --out")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise atomic.write_error(e, out) from None
    atomic.write_text(path, text)


def check_new_out(out: Path) -> None:
    """Refuse a new comparison's ``--out`` that holds something other than a comparison (a
    ``snip report`` folder, the user's own files): the sweep would overwrite its
    ``report.html`` and mix its files in. A comparison's own folder (its definition there, or
    only the hypotheses an earlier start kept) is fine: rerun, resumed or extended."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; choose another --out")
    if not out.is_dir() or (out / SWEEP_FILE).is_file():
        return
    found = sorted(p.name for p in out.iterdir() if p.name != HYPOTHESES_FILE)
    if found:
        shown = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
        raise UserError(f"--out {out} exists and is not a snip compare sweep (it holds {shown}); "
                        "choose another --out, or remove it")


def extends(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Whether definition ``new`` is ``old`` with more arms (same bases, steps, orders, ...;
    every old arm unchanged and first): its finished branches stay valid, the new arms train."""
    same = all(old.get(k) == new.get(k) for k in set(old) | set(new) if k != "arms")
    n = len(old["arms"])
    return same and len(new["arms"]) > n and new["arms"][:n] == old["arms"]


class _Heartbeat:
    """A trainer hook that keeps this worker's claim on its branch fresh."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir, self.last = run_dir, time.monotonic()

    def _beat(self) -> None:
        if time.monotonic() - self.last > HEARTBEAT:
            heartbeat(self.run_dir)
            self.last = time.monotonic()

    def after_step(self, trainer: Any, result: Any) -> None:
        self._beat()

    def on_eval(self, trainer: Any, result: Any) -> None:
        self._beat()


def _train_arm(sweep: Sweep, base: BaseInfo, unit: tuple[int, int],
               arm: Arm) -> dict[str, Any] | None:
    """Train (or resume) one branch; its result, or None if it was interrupted.

    A branch whose final checkpoint exists but whose result is missing (killed between the
    two) is evaluated from that checkpoint, not trained again: a result is never NaN."""
    from snip.train import checkpoint, from_sources
    from snip.train.loop import Hook, Trainer

    class Beat(_Heartbeat, Hook):
        pass

    run_dir = sweep.run_dir(unit, arm)
    overrides = arm_overrides(sweep, base, unit, arm)
    target = overrides["train.steps"]
    found = checkpoint.list_checkpoints(run_dir / "checkpoints")
    if found and int(found[-1].name[len(checkpoint.PREFIX):]) >= target:
        return _evaluate_arm(sweep, base, unit, arm, found[-1])
    keep = {"train.threads": overrides["train.threads"]} if sweep.threads else {}
    if found:
        trainer = Trainer(from_sources(overrides=keep, resume=run_dir), resume=run_dir,
                          hooks=[Beat(run_dir)], bf16_note=False)
    else:
        _clear_unstarted(run_dir)
        trainer = Trainer(from_sources(overrides=overrides, init_from=base.path),
                          init_from=base.path, hooks=[Beat(run_dir)], bf16_note=False)
    try:
        result = trainer.run()
    finally:
        trainer.close()
    if result.interrupted:
        return None
    if not result.evals or result.step < target:  # (cannot happen: the loop evaluates last)
        return _evaluate_arm(sweep, base, unit, arm, checkpoint.find(run_dir))
    return _record(run_dir, sweep, base, unit, arm, result.step, result.val_loss,
                   result.val_loss_hp, result.seconds)


def _clear_unstarted(run_dir: Path) -> None:
    """A branch killed before its first checkpoint left a config and a log, no state: this
    sweep's own files, cleared so the branch starts again (hidden claim and lock stay)."""
    import shutil

    for p in run_dir.iterdir():
        if p.name.startswith("."):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


def _evaluate_arm(sweep: Sweep, base: BaseInfo, unit: tuple[int, int], arm: Arm,
                  ckpt: Path) -> dict[str, Any]:
    """The result of a finished branch from its final checkpoint (evaluation only)."""
    import torch

    from snip.train.inference import load

    if sweep.threads:
        torch.set_num_threads(sweep.threads)
    t0 = time.perf_counter()
    loaded = load(ckpt, flag="--resume")
    r = loaded.evaluate()
    return _record(sweep.run_dir(unit, arm), sweep, base, unit, arm, loaded.step, r.loss,
                   r.loss_hp, time.perf_counter() - t0)


def _record(run_dir: Path, sweep: Sweep, base: BaseInfo, unit: tuple[int, int], arm: Arm,
            step: int, val_loss: float, val_loss_hp: float, seconds: float) -> dict[str, Any]:
    if not (math.isfinite(val_loss) and math.isfinite(val_loss_hp)):
        raise UserError(f"branch {run_dir} ended with a non-finite validation loss "
                        f"({val_loss}, high precision {val_loss_hp}); no result is recorded")
    record = {"unit": list(unit), "arm": arm.label, "base": str(base.path),
              "base_step": base.step, "step": step, "val_loss": val_loss,
              "val_loss_hp": val_loss_hp, "fp4_flop_fraction": _fp4_fraction(run_dir),
              "seconds": seconds, **half_losses(run_dir, sweep.eval_batches)}
    atomic.write_text(run_dir / RESULT_FILE, json.dumps(record, indent=1) + "\n")
    return record


def _fp4_fraction(run_dir: Path) -> float:
    """FP4-FLOP share of the last plan the branch trained with."""
    plans = sorted((run_dir / "plans").glob("step_*.json"), key=lambda p: int(p.stem[5:]))
    if not plans:
        return math.nan
    return float(json.loads(plans[-1].read_text())["meta"].get("fp4_flop_fraction", math.nan))


# ---------------------------------------------------------------------------------------------
# Summarizing


@dataclass
class Summary:
    """The statistics of a sweep's finished arms, for one metric per table."""

    sweep: Sweep
    reference: str
    results: dict[str, dict[tuple[int, int], dict[str, Any]]]
    stats: dict[str, list[Paired]] = field(default_factory=dict)
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    gap_reference: str = ""  # the arm the "gap closed" column measures from
    hypotheses: list[HypothesisResult] = field(default_factory=list)
    diagnostics: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"sweep": self.sweep.to_dict(), "reference": self.reference,
                "gap_reference": self.gap_reference,
                "hypotheses": [h.to_dict() for h in self.hypotheses],
                "diagnostics": self.diagnostics,
                "results": {a: [r for _, r in sorted(u.items())]
                            for a, u in self.results.items()},
                "stats": {m: [p.__dict__ | {"n": p.n, "resolved": p.resolved} for p in ps]
                          for m, ps in self.stats.items()},
                "rows": self.rows}


def _families(arms: Sequence[Arm]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for a in arms:
        if a.family is not None:
            out.setdefault(a.family, []).append(a.label)
    return out


def summarize(sweep: Sweep, reference: str | None = None, gap: str | None = None,
              bases: int = 0) -> Summary:
    """Paired statistics of every arm against ``reference`` over the units where both
    finished; random families also as the per-unit mean of their draws.  ``bases``: only the
    first that many bases enter (0: all), e.g. the n an internal pilot fixed."""
    reference = reference or sweep.reference or sweep.arms[0].label
    gap = sweep.gap if gap is None else gap
    labels = [a.label for a in sweep.arms]
    for name, label in (("--reference", reference), ("--gap", gap)):
        if label and label not in labels:
            raise UserError(f"{name} {label!r} is not one of the arms: {', '.join(labels)}")
    results: dict[str, dict[tuple[int, int], dict[str, Any]]] = {}
    for arm in sweep.arms:
        for unit in sweep.units:
            path = sweep.run_dir(unit, arm) / RESULT_FILE
            record = read_result(path) if not (bases and unit[0] >= bases) else None
            if record is not None:
                results.setdefault(arm.label, {})[unit] = record
    families = _families(sweep.arms)
    # the gap is always measured from the sweep's own reference (its high-precision arm), so
    # the column means the same in a table against another reference (e.g. --reference snip)
    gap_ref = sweep.reference or sweep.arms[0].label
    hyps, diag = _hypotheses(sweep, results, families)
    s = Summary(sweep=sweep, reference=reference, results=results, gap_reference=gap_ref,
                hypotheses=hyps, diagnostics=diag)
    for metric in METRICS:
        values = {a: {u: r[metric] for u, r in by_unit.items()} for a, by_unit in
                  results.items()}
        for fam, members in families.items():
            # the family mean over the draws finished on every unit (a sweep cut short may
            # hold only some draws); where none is, over all draws where every draw finished
            done = [m for m in members if set(values.get(m, {})) >= set(sweep.units)]
            used = done or members
            units = set.intersection(*(set(values.get(m, {})) for m in used))
            values[f"{fam} (mean of {len(used)})"] = {
                u: sum(values[m][u] for m in used) / len(used) for u in units}
        s.stats[metric], s.rows[metric] = _table(values, reference, gap, families, results,
                                                 gap_ref)
    return s


def hypotheses_of(d: dict[str, Any], where: str, sweep: Sweep) -> list[HypothesisSpec]:
    """The hypotheses of file ``d``, checked against ``sweep`` (its arms and random families)
    before any branch trains: a positive ``delta_min``, a list of well-formed hypotheses, and
    every label one of the sweep's."""
    delta = d.get("delta_min")
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not delta > 0:
        raise UserError(f"{where}: delta_min must be a number of nats > 0, got {delta!r}")
    items = d.get("hypotheses", [])
    if not isinstance(items, list) or not all(isinstance(h, dict) for h in items):
        raise UserError(f"{where}: hypotheses must be a list of objects {{id, statement, "
                        "contrasts}}")
    diag = d.get("diagnostics", {})
    if not isinstance(diag, dict):
        raise UserError(f"{where}: diagnostics must be an object ({{\"damage_arm\": ARM}})")
    specs = [HypothesisSpec.from_dict(h) for h in items]
    families = _families(sweep.arms)
    labels = {a.label for a in sweep.arms} | set(families) | {f"search:{f}" for f in families}
    for h in specs:
        for label in (x for pair in h.contrasts for x in pair):
            if label not in labels:
                raise UserError(f"{where}: hypothesis {h.id} names {label!r}, which is not an "
                                f"arm or random family of the sweep")
    return specs


def keep_hypotheses(path: Path, sweep: Sweep, write: bool = True) -> None:
    """Check the hypotheses file ``path`` (`hypotheses_of`) and that the sweep keeps none
    other, then (``write``) keep it as ``OUT/hypotheses.json``: a sweep's pre-registered
    hypotheses never change."""
    d = jsonfile.read_object(path, "--hypotheses")
    hypotheses_of(d, f"--hypotheses {path}", sweep)
    kept = Path(sweep.out) / HYPOTHESES_FILE
    if kept.is_file() and jsonfile.read_object(kept, "hypotheses file") != d:
        raise UserError(f"{kept} holds other hypotheses; a sweep's pre-registered hypotheses "
                        "do not change (use another --out)")
    if write:  # the file as the user wrote it
        atomic.write_text(kept, path.read_bytes().decode("utf-8"))


def _hypotheses(sweep: Sweep, results: dict, families: dict[str, list[str]]
                ) -> tuple[list[HypothesisResult], dict[str, Any]]:
    """The verdicts of the hypotheses declared in ``OUT/hypotheses.json`` (none: []) and the
    diagnostics it asks for (`snip.compare.diagnostics`, on every contrast of two arms)."""
    from snip.compare.diagnostics import diagnostics

    path = Path(sweep.out) / HYPOTHESES_FILE
    if not path.is_file():
        return [], {}
    d = jsonfile.read_object(path, "hypotheses file")
    specs = hypotheses_of(d, str(path), sweep)
    verdicts = evaluate_hypotheses(results, specs, float(d["delta_min"]), families)
    damage_arm = d.get("diagnostics", {}).get("damage_arm", "")
    arms = {a.label for a in sweep.arms}
    pairs = [(a, c) for h in specs for a, c in h.contrasts if a in arms and c in arms]
    return verdicts, diagnostics(sweep, results, damage_arm, pairs) if damage_arm else {}


def _table(values: dict[str, dict[tuple[int, int], float]], reference: str, gap: str,
           families: dict[str, list[str]], results: dict,
           gap_ref: str = "") -> tuple[list[Paired], list[dict]]:
    ref = values.get(reference, {})
    gref = values.get(gap_ref or reference, {})
    stats, rows = [], []
    gap_stat = None
    if gap and gap in values:
        units = sorted(set(values[gap]) & set(gref))
        if units:
            gap_stat = paired(gap, [values[gap][u] for u in units], gap_ref or reference,
                              [gref[u] for u in units])
    for label, by_unit in values.items():
        units = sorted(set(by_unit) & set(ref))
        row: dict[str, Any] = {"arm": label, "n": len(units),
                               "mean": _mean(list(by_unit.values())),
                               "fp4_flop_fraction": _mean([r["fp4_flop_fraction"] for r in
                                                           results.get(label, {}).values()])}
        if units and label != reference:
            p = paired(label, [by_unit[u] for u in units], reference, [ref[u] for u in units])
            stats.append(p)
            row |= {"diff": p.mean, "ci_low": p.ci_low, "ci_high": p.ci_high,
                    "sign_p": p.sign_p, "wilcoxon_p": p.wilcoxon_p}
            if gap_stat is not None and gap in values:
                both = sorted(set(by_unit) & set(values[gap]) & set(gref))
                if both:
                    row["gap_closed"] = gap_closed(_mean([by_unit[u] for u in both]),
                                                   _mean([values[gap][u] for u in both]),
                                                   _mean([gref[u] for u in both]), gap_stat)
        for fam, members in families.items():
            draws = [_mean(list(values[m].values())) for m in members if values.get(m)]
            if draws and label not in members and not label.startswith(f"{fam} (mean"):
                row[f"beats % of {fam}"] = percentile_among(row["mean"], draws)
        rows.append(row)
    return stats, rows


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan
