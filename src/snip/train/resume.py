"""What a run starts from: a fresh run directory, or a checkpoint it resumes or branches from.

Everything here runs before the `Trainer` writes anything, or is the one place that writes the
run directory's starting state:

- `check_compatible`: the checkpoint holds this config's model shape and tokenizer;
- `check_steps_left`: a resume or branch has steps left to train (else it would only log NaN);
- `settings_history`: the run's ``[[history]]`` of changed settings after a resume (refusing the
  changes that would make another run, `config.resume_changes`);
- `schedule_of` / `schedule_at`: the learning-rate schedule from step 0, or continued from a
  checkpoint and stretched where ``train.steps`` changed;
- `prepare_run_dir`: a fresh run never overwrites files it did not write; a resumed one rewrites
  its history after the checkpoint, and `retire_newer` moves the checkpoints of abandoned steps
  aside (never deleted).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from snip.errors import UserError
from snip.train import checkpoint
from snip.train import config as C
from snip.train.metrics import truncate_after
from snip.train.schedule import Schedule

__all__ = ["check_compatible", "check_steps_left", "prepare_run_dir", "retire_newer",
           "schedule_at", "schedule_of", "settings_history"]


def schedule_of(t: C.TrainSection) -> Schedule:
    """The learning-rate schedule of a run that starts at step 0."""
    return Schedule(lr=t.lr, steps=t.steps, warmup_steps=t.warmup_steps,
                    min_lr_ratio=t.min_lr_ratio, shape=t.schedule)


def check_compatible(ckpt: checkpoint.Checkpoint, model: dict, tokenizer: str,
                      flag: str) -> None:
    saved = ckpt.meta.model
    # max_seq_len only bounds the input length (RoPE has no position weights): not a shape.
    diff = {k: (saved.get(k), v) for k, v in model.items()
            if saved.get(k) != v and k != "max_seq_len"}
    verb = "resume" if flag == "--resume" else "branch from"
    if diff:
        k, (old, new) = next(iter(diff.items()))
        raise UserError(f"cannot {verb} {ckpt.path}: it holds a different model shape "
                         f"({k}={old}, this config gives {new}); use the run's own "
                         "model.name and data settings")
    if ckpt.meta.tokenizer != tokenizer:
        raise UserError(f"cannot {verb} {ckpt.path}: it was trained with tokenizer "
                         f"{ckpt.meta.tokenizer!r}, this config uses {tokenizer!r}")


def check_steps_left(path: Path, step: int, steps: int, flag: str) -> None:
    """A resume or branch of checkpoint ``path`` (at ``step``) must have steps left to train
    to ``steps``: otherwise it would only print NaN."""
    if step < steps:
        return
    if flag == "--resume":
        run = C.run_dir_of(path)
        if step == steps:
            raise UserError(f"{run} is already at step {step} (train.steps {steps}): "
                            f"nothing to train; pass --train.steps M (M > {step}) to "
                            "train it further")
        raise UserError(f"--train.steps {steps} is below the step of checkpoint {path} "
                        f"({step}); pass --train.steps M (M > {step}), or resume an "
                        "older checkpoint of the run")
    raise UserError(f"--init-from {path}: the parent is at step {step} and "
                    f"train.steps is {steps}, so the branch has nothing to train; train.steps "
                    f"counts from step 0 of the parent: pass --train.steps M (M > {step})")


def settings_history(cfg: C.Config, saved: C.Config, ckpt: checkpoint.Checkpoint) -> list[dict]:
    """The run's settings history after resuming ``ckpt`` with ``cfg`` (refuses changes that
    would make another run; see `config.resume_changes`)."""
    history = C.read_history_text(ckpt.config_toml)
    diff = C.resume_changes(saved, cfg, ckpt.path)
    return history + ([{"step": ckpt.step, **diff}] if diff else [])


def schedule_at(t: C.TrainSection, ckpt: checkpoint.Checkpoint | None) -> Schedule:
    """The schedule from the checkpoint's on, stretched to ``t.steps`` where that changed."""
    base = schedule_of(t)
    saved = ckpt.meta.schedule if ckpt is not None else None
    if saved is None:
        return base
    anchored = Schedule(lr=t.lr, steps=saved["steps"], warmup_steps=t.warmup_steps,
                        min_lr_ratio=t.min_lr_ratio, shape=t.schedule,
                        anchor_step=saved["anchor_step"], anchor_progress=saved["anchor_progress"])
    return anchored.continued(ckpt.step, t.steps)


def prepare_run_dir(run_dir: Path, cfg: C.Config, ckpt: checkpoint.Checkpoint | None,
                     history: list[dict]) -> None:
    if ckpt is None and checkpoint.list_checkpoints(run_dir / "checkpoints"):
        raise UserError(f"run directory {run_dir} already holds checkpoints; continue it with "
                        f"--resume {run_dir} or choose another --run.name")
    if ckpt is None:  # a fresh run never overwrites files it did not write
        found = sorted(p.name for p in run_dir.iterdir() if not p.name.startswith("."))
        if found:
            raise UserError(f"run directory {run_dir} is not empty (it holds "
                            f"{', '.join(found[:3])}{', ...' if len(found) > 3 else ''}); "
                            "choose another --run.name, or remove it")
    else:
        retire_newer(run_dir, ckpt)
    for sub in ("plans", "checkpoints", "sensitivity"):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    C.write_toml(cfg, run_dir / "config.toml", history)
    if ckpt is None:
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)
        for old in (run_dir / "plans").glob("step_*.json"):
            old.unlink()
    else:  # the resumed run rewrites history after its checkpoint
        truncate_after(run_dir / "metrics.jsonl", ckpt.step)
        for old in (run_dir / "plans").glob("step_*.json"):
            if int(old.stem.split("_")[1]) > ckpt.step:
                old.unlink()


def retire_newer(run_dir: Path, ckpt: checkpoint.Checkpoint) -> None:
    """Resuming an older checkpoint abandons the steps after it: its newer checkpoints move to
    ``retired/<time>/`` (never deleted), so that a later plain ``--resume`` continues this
    timeline, not the abandoned one."""
    root = run_dir / "checkpoints"
    newer = [p for p in checkpoint.list_checkpoints(root)
             if int(p.name[len(checkpoint.PREFIX):]) > ckpt.step]
    if not newer:
        return
    dest = run_dir / "retired" / time.strftime("%Y%m%d-%H%M%S")
    dest.mkdir(parents=True, exist_ok=True)
    for p in newer:
        os.replace(p, dest / p.name)
    print(f"snip train: resuming from step {ckpt.step}: moved the newer checkpoint(s) "
          f"{', '.join(p.name for p in newer)} of the abandoned steps aside to {dest}",
          file=sys.stderr)
