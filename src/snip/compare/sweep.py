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

An arm with a ``result.json`` is never trained again; one that was interrupted (Ctrl-C saves a
checkpoint) is resumed; a sweep killed at any moment continues where it stopped.

Several workers may run one sweep at once (``snip compare --resume OUT`` in another process):
each branch is claimed first (``.claim`` in its run directory holds the worker's pid, created
atomically; a claim whose process is gone is taken over), and a worker skips branches another
live worker holds.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
from snip.train.rundir import pid_alive

SWEEP_FILE, RESULT_FILE, CLAIM_FILE = "sweep.json", "result.json", ".claim"
HYPOTHESES_FILE = "hypotheses.json"  # {"delta_min": nats, "hypotheses": [...]} (optional)
METRICS = ("val_loss_hp", "val_loss")  # high precision first: the primary comparison


@dataclass(frozen=True, kw_only=True)
class Sweep:
    """The definition of a comparison (see the module docstring)."""

    bases: tuple[str, ...]
    arms: tuple[Arm, ...]
    steps: int
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
    path = out / SWEEP_FILE
    if not path.is_file():
        raise UserError(f"--resume: {out} holds no comparison ({SWEEP_FILE} is missing)")
    return Sweep.from_dict(json.loads(path.read_text()), str(out), threads)


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


def run_sweep(sweep: Sweep, echo: Callable[[str], None] = print, arm_major: bool = False) -> bool:
    """Train every missing (unit, arm) in :func:`schedule` order; True when all finished,
    False when interrupted."""
    infos = check_bases(sweep.bases)
    _write_definition(sweep)
    progress = Progress(total=len(sweep.units) * len(sweep.arms), echo=echo)
    for unit, arm in schedule(sweep, arm_major):
        run_dir = sweep.run_dir(unit, arm)
        name = f"b{unit[0]} o{unit[1]} {arm.label}"
        if (run_dir / RESULT_FILE).is_file():
            progress.tick(f"{name}: done earlier", None)
            continue
        if not claim(run_dir):
            progress.tick(f"{name}: another worker has it", None)
            continue
        t0 = time.perf_counter()
        try:
            result = _train_arm(sweep, infos[unit[0]], unit, arm)
        finally:
            release(run_dir)
        if result is None:
            return False
        progress.tick(f"{name}: val loss {result['val_loss']:.4f} (high precision "
                      f"{result['val_loss_hp']:.4f})", time.perf_counter() - t0)
    return True


def claim(run_dir: Path) -> bool:
    """Claim a branch for this process; False when another live process holds it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path, mine = run_dir / CLAIM_FILE, run_dir / f"{CLAIM_FILE}.{os.getpid()}"
    mine.write_text(str(os.getpid()))
    try:
        for _ in range(2):
            try:
                os.link(mine, path)  # atomic: fails if a claim exists
                return True
            except FileExistsError:
                try:
                    pid = int(path.read_text())
                except (OSError, ValueError):
                    return False  # being written or removed right now: leave it
                if pid == os.getpid():
                    return True
                if pid_alive(pid):
                    return False
                path.unlink(missing_ok=True)  # its worker is gone: take it over
        return False
    finally:
        mine.unlink(missing_ok=True)


def release(run_dir: Path) -> None:
    """Drop this process's claim on a branch (no-op if it holds none)."""
    path = run_dir / CLAIM_FILE
    try:
        if int(path.read_text()) == os.getpid():
            path.unlink()
    except (OSError, ValueError):
        pass


def _write_definition(sweep: Sweep) -> None:
    out = Path(sweep.out)
    path, text = out / SWEEP_FILE, json.dumps(sweep.to_dict(), indent=1) + "\n"
    if path.is_file():
        old = json.loads(path.read_text())
        if old == sweep.to_dict():
            return
        if not extends(old, sweep.to_dict()):
            raise UserError(f"{out} holds another comparison (its {SWEEP_FILE} differs); "
                            f"continue it with snip compare --resume {out}, add arms by "
                            "repeating its definition with more --arm, or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def extends(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Whether definition ``new`` is ``old`` with more arms (same bases, steps, orders, ...;
    every old arm unchanged and first): its finished branches stay valid, the new arms train."""
    same = all(old.get(k) == new.get(k) for k in set(old) | set(new) if k != "arms")
    n = len(old["arms"])
    return same and len(new["arms"]) > n and new["arms"][:n] == old["arms"]


def _train_arm(sweep: Sweep, base: BaseInfo, unit: tuple[int, int],
               arm: Arm) -> dict[str, Any] | None:
    """Train (or resume) one branch; its result, or None if it was interrupted."""
    from snip.train import checkpoint, from_sources, train

    run_dir = sweep.run_dir(unit, arm)
    overrides = arm_overrides(sweep, base, unit, arm)
    if checkpoint.list_checkpoints(run_dir / "checkpoints"):
        keep = {"train.threads": overrides["train.threads"]} if sweep.threads else {}
        result = train(from_sources(overrides=keep, resume=run_dir), resume=run_dir)
    else:
        cfg = from_sources(overrides=overrides, init_from=base.path)
        result = train(cfg, init_from=base.path)
    if result.interrupted:
        return None
    record = {"unit": list(unit), "arm": arm.label, "base": str(base.path),
              "base_step": base.step, "step": result.step, "val_loss": result.val_loss,
              "val_loss_hp": result.val_loss_hp, "fp4_flop_fraction": _fp4_fraction(run_dir),
              "seconds": result.seconds, **half_losses(run_dir, sweep.eval_batches)}
    tmp = run_dir / (RESULT_FILE + ".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(run_dir / RESULT_FILE)
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
            if path.is_file() and not (bases and unit[0] >= bases):
                results.setdefault(arm.label, {})[unit] = json.loads(path.read_text())
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


def _hypotheses(sweep: Sweep, results: dict, families: dict[str, list[str]]
                ) -> tuple[list[HypothesisResult], dict[str, Any]]:
    """The verdicts of the hypotheses declared in ``OUT/hypotheses.json`` (none: []) and the
    diagnostics it asks for (`snip.compare.diagnostics`, on every contrast of two arms)."""
    from snip.compare.diagnostics import diagnostics

    path = Path(sweep.out) / HYPOTHESES_FILE
    if not path.is_file():
        return [], {}
    d = json.loads(path.read_text())
    specs = [HypothesisSpec.from_dict(h) for h in d.get("hypotheses", [])]
    labels = {a.label for a in sweep.arms} | set(families) | {f"search:{f}" for f in families}
    for h in specs:
        for label in (x for pair in h.contrasts for x in pair):
            if label not in labels:
                raise UserError(f"{path}: hypothesis {h.id} names {label!r}, which is not an "
                                f"arm or random family of the sweep")
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
