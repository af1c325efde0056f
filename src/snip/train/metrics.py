"""Run logging: ``metrics.jsonl``, the progress bar and (optionally) TensorBoard.

``metrics.jsonl`` holds one JSON object per event, each with an ``event`` kind and the ``step``
(optimizer steps completed when it was written)::

    {"event": "train", "step": 10, "loss": 4.91, "lr": 0.0006, "tokens_per_s": 20510.3,
     "grad_norm": 1.2, "fp4_flop_fraction": 0.0, "time": 12.4}
    {"event": "eval", "step": 100, "val_loss": 2.71, "ppl": 15.0}
    {"event": "plan", "step": 0, "path": "plans/step_0.json", "fp4_flop_fraction": 0.0,
     "changes": 0}
    {"event": "checkpoint", "step": 250, "path": "checkpoints/step_000250"}
    {"event": "nonfinite", "step": 31, "loss": NaN, "skipped": 1}

With ``--writeback.policy`` set, train events also carry ``writeback_frozen`` and
``writeback_never_moved`` (see `snip.train.writeback`).

``snip report`` reads only this file, ``config.toml`` and ``plans/``. Only rank 0 writes, and
only while it holds the run directory's lock (`snip.train.rundir`; the log releases it on
``close``).

Nothing is lost on a crash: events are appended one line at a time (a kill leaves at most a torn
last line, which readers skip), and when a resumed run drops the events after its checkpoint,
the trimmed copy is written beside the file, fsynced and renamed over it, so a kill at any
moment leaves either the old history or the new one. A full disk stops the run with a one-line
error naming the file.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from tqdm import tqdm

from snip.errors import UserError, disk_error


def _clean(value: Any) -> Any:
    # JSON has no NaN/inf; write them as strings so every line stays standard JSON.
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class MetricsLog:
    """Append-only JSON-lines log plus an optional TensorBoard mirror."""

    def __init__(self, path: Path | None, tensorboard_dir: Path | None = None,
                 lock: Any = None):
        self.path = path
        self.lock = lock  # the run directory's RunLock, released by close()
        self._tb = _tensorboard(tensorboard_dir) if tensorboard_dir is not None else None

    def log(self, event: str, step: int, **values: Any) -> None:
        if self.path is None:
            return
        record = {"event": event, "step": step, **{k: _clean(v) for k, v in values.items()}}
        line = json.dumps(record) + "\n"
        try:
            with self.path.open("a") as f:
                f.write(line)
        except OSError as e:
            raise disk_error(e, self.path, len(line)) from None
        if self._tb is not None:
            for k, v in values.items():
                if isinstance(v, int | float) and not isinstance(v, bool):
                    self._tb.add_scalar(f"{event}/{k}", v, step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self.lock is not None:
            self.lock.release()


def check_tensorboard() -> None:
    """Raise a `UserError` now, before a run writes anything, if TensorBoard is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        raise UserError("log.tensorboard = true needs the tensorboard package: "
                        "pip install 'snip[tensorboard]'") from None


def _tensorboard(log_dir: Path) -> Any:
    check_tensorboard()
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir=str(log_dir))


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every event of a metrics.jsonl (a torn last line from a killed run is dropped)."""
    if not path.is_file():
        return []
    events = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict):  # a line that is not an event object is not ours: skip it
            events.append(event)
    return events


def _step(event: dict[str, Any]) -> float:
    step = event.get("step", 0)
    return step if isinstance(step, int | float) else 0


def truncate_after(path: Path, step: int) -> None:
    """Drop events later than ``step``: a resumed run rewrites that part of its history.

    Atomic: the trimmed copy goes to a hidden file beside ``path`` and is renamed over it."""
    for stale in path.parent.glob(f".{path.name}.tmp-*"):  # left by a killed rewrite
        stale.unlink(missing_ok=True)
    if not path.is_file():
        return
    text = "".join(json.dumps(e) + "\n" for e in read_metrics(path) if _step(e) <= step)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise disk_error(e, path, len(text)) from None


def progress_bar(total: int, initial: int, enabled: bool) -> tqdm:
    """Steps done / total with ETA; the loop sets loss and tokens/s as the postfix."""
    return tqdm(total=total, initial=initial, disable=not enabled, unit="step",
                dynamic_ncols=True, leave=True)
