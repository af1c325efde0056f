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

import contextlib
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tqdm import tqdm

from snip import atomic
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

    Atomic (`snip.atomic`): a kill mid-rewrite leaves the old history, whose temporary the next
    rewrite removes."""
    if not path.is_file():
        atomic.clean_stale(path)
        return
    text = "".join(json.dumps(e) + "\n" for e in read_metrics(path) if _step(e) <= step)
    atomic.write_text(path, text)


class Progress:
    """What a run shows while it trains.

    On a terminal with ``log.progress`` on: a tqdm bar (steps, ETA, loss and tokens/s), created
    after the first step, so that step's one-time kernel compilation is not read as the pace.
    Otherwise -- ``log.progress false``, or stderr redirected to a file, which must not fill up
    with bar redraws -- one line per logging interval on stdout:
    ``step 20/200  loss 3.153  tok_s 31,950  eta 0:42``.  ``write`` prints a line either way;
    ``busy`` names a pause between steps (validation, a statistics cycle) on the bar."""

    def __init__(self, total: int, initial: int, *, bar: bool, main: bool = True,
                 terminal: bool | None = None) -> None:
        import sys
        import time

        self.total, self.done, self.main = total, initial, main
        self.use_bar = main and bar and (sys.stderr.isatty() if terminal is None else terminal)
        self._bar: tqdm | None = None
        self._clock, self._t0, self._n0 = time.perf_counter, None, initial

    def update(self, n: int = 1) -> None:
        self.done += n
        if self._t0 is None:  # the pace counts from the end of the first step
            self._t0, self._n0 = self._clock(), self.done
        if self.use_bar:
            if self._bar is None:
                self._bar = tqdm(total=self.total, initial=self.done, unit="step",
                                 dynamic_ncols=True, leave=True)
            else:
                self._bar.update(n)

    def set_postfix(self, **values: str) -> None:
        """The numbers of this logging interval: the bar's postfix, or one line."""
        if self._bar is not None:
            self._bar.set_postfix(**values)
        elif self.main:
            parts = [f"step {self.done}/{self.total}", *(f"{k} {v}" for k, v in values.items())]
            eta = self.eta()
            print("  ".join(parts + ([f"eta {eta}"] if eta else [])), flush=True)

    def eta(self) -> str:
        """Time left at the pace since the first step ('' before it is known, and at the end)."""
        if self._t0 is None or self.done <= self._n0 or self.done >= self.total:
            return ""
        left = (self._clock() - self._t0) / (self.done - self._n0) * (self.total - self.done)
        minutes, seconds = divmod(int(left), 60)
        return f"{minutes // 60}:{minutes % 60:02d}:{seconds:02d}" if minutes >= 60 else \
            f"{minutes}:{seconds:02d}"

    @contextlib.contextmanager
    def busy(self, what: str) -> Iterator[None]:
        """Name the work between two steps (a statistics cycle, a validation) on the bar while
        it runs, so that a bar that stops moving says why; nothing is printed without a bar."""
        if self._bar is None:
            yield
            return
        self._bar.set_description_str(what)
        try:
            yield
        finally:
            self._bar.set_description_str("")

    def write(self, line: str) -> None:
        if self._bar is not None:
            self._bar.write(line)
        else:
            print(line, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def kernels_compiled() -> bool:
    """Whether numba's on-disk cache already holds snip's fused kernels (the first run on a
    machine compiles them: 20-30 s in its first step).  True when the kernels are off."""
    import importlib.util

    if os.environ.get("SNIP_FAST", "1") == "0" or importlib.util.find_spec("numba") is None:
        return True
    spec = importlib.util.find_spec("snip.formats.fast")
    if spec is None or spec.origin is None:
        return True
    here = Path(spec.origin).parent
    dirs = [here / "__pycache__"]
    if os.environ.get("NUMBA_CACHE_DIR"):
        dirs += [p.parent for p in Path(os.environ["NUMBA_CACHE_DIR"]).rglob("fast.*.nbi")]
    return any(any(d.glob("fast.*.nbi")) for d in dirs if d.is_dir())


COMPILE_NOTE = ("compiling kernels, once per machine (numba, about 20-30 s in the first step; "
                "later runs reuse the cache)")


def progress_bar(total: int, initial: int, enabled: bool) -> Progress:
    """A `Progress` with a bar when ``enabled`` (kept for callers of the old name)."""
    return Progress(total, initial, bar=enabled)
