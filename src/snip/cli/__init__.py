"""The ``snip`` command line: thin wrappers over the library.

Each subcommand lives in its own module here and exposes ``COMMAND`` (its name, a string
literal), ``HELP`` (one line, a string literal), ``add_arguments(parser)`` and
``run(args) -> int``.  Adding a command means adding a file: modules are discovered by reading
their ``COMMAND`` and ``HELP`` assignments from the source (:func:`commands`), *without importing
them*, and only the module of the command being run is imported.  That keeps ``snip --help`` and
``snip formats`` free of torch and the training stack (start-up in well under a second; see
``benchmarks/RESULTS.md``).  Keep ``COMMAND`` and ``HELP`` plain string literals at module level
so that discovery can read them; ``tests/cli/test_cli_startup.py`` checks every module.

Commands report bad input by raising the library's own `snip.UserError` (there is no
CLI-specific exception): it is printed as one line and the exit code is 2; nothing is lost
because commands validate before they write.  Any other exception is a bug and keeps its
traceback; ``SNIP_DEBUG=1`` shows the traceback of a user error too.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import importlib
import os
import pkgutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from snip.errors import UserError


@dataclass(frozen=True)
class CommandInfo:
    """A subcommand found on disk: its name, one-line help and the module implementing it."""

    name: str
    help: str
    module: str

    def load(self):
        return importlib.import_module(self.module)


def _literal_assignments(path: Path) -> dict[str, str]:
    """Module-level ``NAME = "literal"`` assignments of a source file (no import)."""
    found: dict[str, str] = {}
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return found
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            if isinstance(node.value.value, str):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        found[target.id] = node.value.value
    return found


def commands() -> dict[str, CommandInfo]:
    """Every subcommand module of this package, by command name, read from source."""
    found: dict[str, CommandInfo] = {}
    here = Path(__file__).parent
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.ispkg:
            continue
        consts = _literal_assignments(here / f"{info.name}.py")
        if "COMMAND" in consts:
            found[consts["COMMAND"]] = CommandInfo(consts["COMMAND"], consts.get("HELP", ""),
                                                   f"{__name__}.{info.name}")
    return found


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("snip")
    except Exception:  # not installed (PYTHONPATH=src): ask the package itself
        from snip import __version__

        return __version__


class _Version(argparse.Action):
    """``--version`` that only looks the version up when asked."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="show program's version number and exit"):
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"snip {_version()}")
        parser.exit()


class HelpFormatter(argparse.HelpFormatter):
    """Each default shown once: ``(default: X)`` is added only where the help text does not
    already say its default, and never for a required option, a positional, a flag that is off
    by default or an option without a default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("default" in text or action.required or not action.option_strings
                or default is None or default is argparse.SUPPRESS or default is False
                or default in ("", [])):  # (by identity: a default of 0 == False is shown)
            return text
        if isinstance(default, str) and default.strip() != default:  # "\n": show it as such
            return text + f" (default: {default!r})".replace("%", "%%")
        return text + " (default: %(default)s)"


# One flag style: options that are run-configuration keys use the dotted key everywhere.
# command -> {older spelling: dotted key}; the older spellings still parse for one release,
# with a deprecation line (`deprecations`), and --help shows only the dotted key.
# (``compare --steps`` stays: it counts the steps of each branch, not ``train.steps``.)
DOTTED = {
    "audit": {"--model": "--model.name", "--steps": "--train.steps",
              "--batch": "--train.batch_size", "--seq-len": "--train.seq_len",
              "--lr": "--train.lr", "--weight-decay": "--train.weight_decay",
              "--threads": "--train.threads"},
    "compare": {"--threads": "--train.threads", "--eval-batches": "--train.eval_batches",
                "--candidates": "--precision.candidates"},
    "plan": {"--budget": "--precision.budget", "--method": "--precision.method",
             "--candidates": "--precision.candidates", "--seed": "--precision.plan_seed",
             "--precision.seed": "--precision.plan_seed",
             "--micro-batches": "--precision.calib_batches"},
}


def _dotted_names(parser: argparse.ArgumentParser, command: str) -> None:
    """Give the options of ``DOTTED[command]`` their dotted key as the name shown in help; the
    older spelling keeps parsing (it stays in the parser's table of option strings)."""
    for old, new in DOTTED.get(command, {}).items():
        action = parser._option_string_actions.get(old)
        if action is None:
            continue
        parser._option_string_actions.setdefault(new, action)
        if parser._option_string_actions[new] is not action:
            continue  # the command defines the dotted key itself, separately
        action.option_strings = [new, *(o for o in action.option_strings
                                        if o not in (old, new) and o not in DOTTED[command])]


def deprecations(command: str, argv: Sequence[str]) -> list[str]:
    """One line per older spelling of a dotted key used in ``argv``."""
    table = DOTTED.get(command, {})
    used = dict.fromkeys(a.split("=", 1)[0] for a in argv if a.split("=", 1)[0] in table)
    return [f"snip {command}: {old} is deprecated, use {table[old]} (the old spelling goes "
            "in the next release)" for old in used]


def unknown_argument(parser: argparse.ArgumentParser, command: str,
                     extras: Sequence[str]) -> str:
    """The one line that answers the arguments ``command``'s parser does not know (``extras``,
    in command-line order), about the first: an unknown option with the closest valid one
    (``--trian.steps``: did you mean ``--train.steps``?), or an argument the command has no
    place for.  Older spellings (:data:`DOTTED`) are never suggested."""
    see = f"see snip {command} --help"
    if not extras[0].startswith("-"):
        return f"unexpected argument {extras[0]!r}; {see}"
    bad = extras[0].split("=", 1)[0]
    # each valid option by its name and by its last dotted part (--budgt: --precision.budget),
    # without dashes (with them, any short option is "close": --bogus to --out)
    names: dict[str, str] = {}
    for o in parser._option_string_actions:
        if o not in DOTTED.get(command, {}):
            names.setdefault(o.lstrip("-"), o)
            names.setdefault(o.rsplit(".", 1)[-1].lstrip("-"), o)
    close = difflib.get_close_matches(bad.lstrip("-"), names, n=1, cutoff=0.6)
    return f"unknown option {bad}; " + (f"did you mean {names[close[0]]}?" if close else see)


def build_parser(load: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``snip`` parser; subcommands named in ``load`` (all when ``None``) get their options.

    Subcommands not loaded are listed with their help line only, so ``snip --help`` imports no
    subcommand module.
    """
    parser = argparse.ArgumentParser(
        prog="snip",
        allow_abbrev=False,
        description=("FP8 and sub-byte LLM training with adaptive per-layer precision (SNIP)."),
    )
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, cmd in commands().items():
        # no prefix matching: `--train.step 5` must be an error, not `--train.steps 5`
        p = sub.add_parser(
            name,
            allow_abbrev=False,
            help=cmd.help,
            description=cmd.help,
            formatter_class=HelpFormatter,
        )
        if load is None or name in load:
            mod = cmd.load()
            mod.add_arguments(p)
            _dotted_names(p, name)
            p.set_defaults(_run=mod.run, _parser=p)
    return parser


def _requested(argv: Sequence[str]) -> list[str]:
    """The subcommand named on the command line (the first argument not starting with '-')."""
    for a in argv:
        if not a.startswith("-"):
            return [a]
    return []


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(load=_requested(argv))
    args, extras = parser.parse_known_args(argv)
    if not getattr(args, "_run", None):
        if extras:
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        parser.print_help()
        return 2
    if extras:  # one line, nothing run (argparse would dump the top-level usage)
        line = unknown_argument(args._parser, args.command, extras)
        print(f"snip {args.command}: error: {line}", file=sys.stderr)
        return 2
    for line in deprecations(args.command, argv):
        print(line, file=sys.stderr)
    if args.command not in ("formats",):  # pure-table commands need no allocator tuning
        from snip.runtime import tune_malloc

        tune_malloc()
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
