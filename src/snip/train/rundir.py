"""One writer per run directory: an exclusive lock that the kernel releases when its holder dies.

Two ``snip train`` processes writing the same ``runs/NAME`` would interleave ``metrics.jsonl``
and overwrite each other's checkpoints. So the process that writes a run directory (rank 0)
first takes ``fcntl.flock(LOCK_EX | LOCK_NB)`` on ``runs/NAME/.lock`` and writes its PID into
it. A second writer -- a fresh run with the same ``--run.name`` or a concurrent ``--resume`` --
fails at once with a `UserError` naming the holder's PID, before it touches anything.

``flock`` locks belong to the open file, not to the file name: the kernel drops the lock when
the holder exits for any reason (including SIGKILL), so a stale ``.lock`` file never blocks the
next run and there is nothing to clean up. The lock is advisory and local to one machine's
kernel (not reliable on some network file systems).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from snip.atomic import pid_alive, write_error
from snip.errors import UserError

__all__ = ["LOCK_NAME", "RunLock", "lock", "pid_alive", "released_on_error"]

LOCK_NAME = ".lock"


class RunLock:
    """The exclusive writer lock of one run directory (see the module docstring)."""

    def __init__(self, run_dir: Path, flag: str = "--run.name") -> None:
        self.path = Path(run_dir) / LOCK_NAME
        self.flag = flag  # the option that chooses another directory, for the refusal
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        try:  # a read-only file system, a full disk, a name too long: one line
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise write_error(e, self.path.parent) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise UserError(f"run directory {self.path.parent} is in use by another snip "
                            f"process (PID {holder}); wait for it to finish or stop it, or "
                            f"choose another {self.flag}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the file drops the flock
            self._fd = None

    def __del__(self) -> None:  # a run that failed half-way must not keep its directory locked
        self.release()

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock(run_dir: Path) -> RunLock:
    """Take the writer lock of ``run_dir`` (created if missing) or raise `UserError`."""
    return RunLock(run_dir).acquire()


@contextlib.contextmanager
def released_on_error(held: RunLock | None) -> Iterator[None]:
    """Release ``held`` if the block raises (a run that fails to start keeps no lock)."""
    try:
        yield
    except BaseException:
        if held is not None:
            held.release()
        raise
