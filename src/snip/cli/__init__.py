"""The ``snip`` command line: thin wrappers over the library.

Each subcommand lives in its own module here and exposes ``COMMAND`` (its name), ``HELP`` (one
line), ``add_arguments(parser)`` and ``run(args) -> int``.  Modules are discovered automatically,
so adding a command means adding a file.  Commands report bad input by raising the library's own
`snip.UserError` (there is no CLI-specific exception): it is printed as one line and the exit
code is 2; nothing is lost because commands validate before they write.  Any other exception is a
bug and keeps its traceback; ``SNIP_DEBUG=1`` shows the traceback of a user error too.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from collections.abc import Sequence

from snip.errors import UserError


def _commands() -> dict[str, object]:
    found = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(mod, "COMMAND"):
            found[mod.COMMAND] = mod
    return found


def build_parser() -> argparse.ArgumentParser:
    from snip import __version__

    parser = argparse.ArgumentParser(
        prog="snip",
        allow_abbrev=False,
        description=("FP8 and sub-byte LLM training with adaptive per-layer precision (SNIP)."),
    )
    parser.add_argument("--version", action="version", version=f"snip {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, mod in _commands().items():
        # no prefix matching: `--train.step 5` must be an error, not `--train.steps 5`
        p = sub.add_parser(
            name,
            allow_abbrev=False,
            help=mod.HELP,
            description=mod.HELP,
            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        )
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from snip.runtime import tune_malloc

    tune_malloc()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except UserError as e:
        if os.environ.get("SNIP_DEBUG", "") not in ("", "0"):
            raise
        print(f"snip {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"snip {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
