"""The project's one user-error type.

Everything that is the *user's* fault -- a bad flag, a missing or malformed file, a run directory
that cannot be resumed, a format the emulation cannot represent -- is raised as ``UserError``.
It subclasses ``ValueError`` so library callers who already catch ``ValueError`` keep working.

The split matters for the CLI (``snip.cli.main``): it turns *only* ``UserError`` into one line on
stderr and exit code 2.  Any other exception (``TypeError``, ``KeyError``, a plain ``ValueError``
from deep inside torch) is a bug in snip or a dependency and keeps its traceback, so it gets
reported instead of being mistaken for bad input.  Set ``SNIP_DEBUG=1`` to see the traceback of a
``UserError`` too.

Messages name the offending value (and the key or file it came from) and, where there is one, the
fix: ``--train.lr must be a finite positive number, got 1e+39``.
"""

from __future__ import annotations

import enum
import errno
from pathlib import Path
from typing import TypeVar

__all__ = ["MissingFileError", "UserError", "disk_error", "parse_enum"]

E = TypeVar("E", bound=enum.Enum)


class UserError(ValueError):
    """Bad input from the user: shown by the CLI as one line, exit code 2."""


class MissingFileError(UserError, FileNotFoundError):
    """A file or directory the user named does not exist (also a ``FileNotFoundError``)."""


def disk_error(e: OSError, path: Path, needed: int) -> Exception:
    """A full disk (or quota) as a one-line `UserError` naming the file; other errors as is."""
    if e.errno not in (errno.ENOSPC, errno.EDQUOT):
        return e
    return UserError(f"no space left on device writing {path} (needed about {needed:,} bytes);"
                     " free some space and continue with --resume")


def parse_enum(cls: type[E], value: E | str, what: str) -> E:
    """``value`` as a member of the string-valued enum ``cls`` (case-insensitive, ``-`` read as
    ``_``), or a `UserError` naming ``what`` it should have been and the valid values."""
    if isinstance(value, cls):
        return value
    try:
        return cls(str(value).lower().replace("-", "_"))
    except ValueError:
        valid = ", ".join(str(m.value) for m in cls)
        raise UserError(f"unknown {what} {value!r}; valid: {valid}") from None
