"""Atomic outputs: every file or directory snip writes appears whole or not at all.

A reader (or a kill, or a full disk) must never see half an output. So each output is written
beside its target under a hidden name that carries the writer's PID, fsynced, and renamed into
place with ``os.replace`` (atomic on POSIX)::

    write_text(path, text)        # .NAME.tmp-<pid> -> NAME
    with output_dir(out) as tmp:  # fill tmp (.NAME.tmp-<pid>/), renamed to NAME on success
        ...

On an error the temporary is removed, and a full disk, a read-only file system or a missing
permission becomes a one-line `UserError` naming the file. A temporary left by a killed writer
(its PID is gone) is found and removed by the next write of the same target (`clean_stale`).

Where an output may go is checked here too: never into a run, a checkpoint or a `snip compare`
sweep that the output is not (`owner`), since their files are snip's own.

This module sits below everything else (it imports only `snip.errors`), so the sensitivity
tables, plans, reports, exports and compare summaries all share it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from snip.errors import UserError

TMP = ".tmp-"  # the temporary of NAME is .NAME.tmp-<pid>


def owner(path: str | Path) -> tuple[Path, str] | None:
    """The run directory, checkpoint or `snip compare` sweep that ``path`` is or lies inside
    (its real path), and which of them it is (``"run"``, ``"checkpoint"``, ``"snip compare
    sweep"``); ``None`` for neither.  Commands refuse to write an output the user named there
    unless it is that thing's own (a plan written over a run's ``config.toml`` lost the run).

    Each is known by two of its files, so that a directory of other files with one of these
    common names (a ``meta.json`` of another tool in a home directory) is not taken for one: a
    checkpoint holds ``meta.json`` and ``config.toml``, a run ``config.toml`` and
    ``metrics.jsonl`` or ``checkpoints/``, a sweep ``sweep.json`` and ``runs/``."""
    target = Path(os.path.realpath(path))
    for parent in (target, *target.parents):
        config = (parent / "config.toml").is_file()
        if config and (parent / "meta.json").is_file():
            return parent, "checkpoint"
        if (parent / "sweep.json").is_file() and (parent / "runs").is_dir():
            return parent, "snip compare sweep"
        if config and ((parent / "metrics.jsonl").is_file() or (parent / "checkpoints").is_dir()):
            return parent, "run"
    return None


def check_outside(path: str | Path, flag: str,
                  own: tuple[str | Path, str] | None = None) -> None:
    """Refuse (one-line `UserError`) an output path the user named with ``flag`` that is or
    lies inside a run, checkpoint or sweep (`owner`), unless that is ``own``: the command's
    own directory (any spelling of it) and what it must be (``"run"``, ``"snip compare
    sweep"``)."""
    inside = owner(path)
    if inside is not None and (own is None or inside != (Path(os.path.realpath(own[0])),
                                                          own[1])):
        raise UserError(f"{flag} {path} is or lies inside the {inside[1]} {inside[0]}; choose a "
                        "path outside it")


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, ValueError):
        return False
    return True


def temp_path(path: Path) -> Path:
    """The hidden temporary of ``path`` for this process."""
    return path.with_name(f".{path.name}{TMP}{os.getpid()}")


def clean_stale(path: Path) -> None:
    """Remove temporaries of ``path`` left by writers that are gone (killed mid-write)."""
    prefix = f".{path.name}{TMP}"
    with contextlib.suppress(OSError):
        for p in path.parent.iterdir():
            pid = p.name[len(prefix):]
            if p.name.startswith(prefix) and pid.isdigit() and (
                    int(pid) == os.getpid() or not pid_alive(int(pid))):
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)


def write_error(e: OSError, path: Path, needed: int = 0) -> Exception:
    """An OSError while writing ``path`` as a one-line `UserError` where it is the user's to
    fix (full disk, read-only file system, permission, a file where a directory is wanted or
    the reverse, a name too long); any other error as it is."""
    size = f" (needed about {needed:,} bytes)" if needed else ""
    why = {errno.ENOSPC: f"no space left on device{size}",
           errno.EDQUOT: f"disk quota exceeded{size}",
           errno.EROFS: "read-only file system",
           errno.EACCES: "permission denied",
           errno.EPERM: "operation not permitted",
           errno.EISDIR: "it is a directory",
           errno.ENOTDIR: "a part of the path is not a directory",
           errno.EEXIST: "a file of that name exists",
           errno.ENAMETOOLONG: "file name too long"}.get(e.errno)
    if why is None:
        return e
    return UserError(f"cannot write {path}: {why}")


def _fsync(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see the module docstring)."""
    path = Path(path)
    clean_stale(path)
    tmp = temp_path(path)
    try:
        if path.is_dir():
            raise IsADirectoryError(errno.EISDIR, "Is a directory", str(path))
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise write_error(e, path, len(data)) from None
    _fsync(path.parent)


def write_text(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    write_bytes(path, text.encode())


def replace_dir(tmp: Path, final: Path) -> None:
    """Rename the finished directory ``tmp`` to ``final``; an existing ``final`` is moved aside
    first and removed only after the new one is in place."""
    if final.exists() or final.is_symlink():
        old = final.with_name(f".{final.name}.old{TMP}{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)
    else:
        os.replace(tmp, final)
    _fsync(final.parent)


@contextlib.contextmanager
def output_dir(final: str | Path) -> Iterator[Path]:
    """A hidden temporary directory beside ``final`` to fill; renamed to ``final`` when the
    block succeeds (replacing an earlier one), removed when it fails."""
    final = Path(final)
    clean_stale(final)
    clean_stale(final.with_name(f"{final.name}.old"))
    tmp = temp_path(final)
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    except OSError as e:
        raise write_error(e, final) from None
    try:
        yield tmp
        for p in tmp.rglob("*"):
            if p.is_file():
                _fsync(p)
        replace_dir(tmp, final)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise write_error(e, final) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
