"""Every ``snip COMMAND --flag ...`` that snip's messages, docstrings, README or docs suggest
names flags that command has, in their current spelling (not a deprecated one, not one that
never existed): a user copies these lines."""

from __future__ import annotations

import re
from pathlib import Path

from snip.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
# "snip CMD" then its arguments up to the end of the line, a backtick or a quote
_COMMAND = re.compile(r"\bsnip ([a-z]+)((?: +[^\s`'\"]+)+)")


def _subcommands() -> dict:
    """Each command's parser, found as the other CLI tests find it."""
    parser = build_parser()
    return dict(next(a for a in parser._actions if a.dest == "command").choices)


def _texts() -> list[Path]:
    return [*sorted((ROOT / "src" / "snip").rglob("*.py")), ROOT / "README.md",
            *sorted((ROOT / "docs").glob("*.md"))]


def test_suggested_commands_name_current_flags() -> None:
    commands = _subcommands()
    seen, bad = 0, []
    for path in _texts():
        for line in path.read_text().splitlines():
            for m in _COMMAND.finditer(line):
                if m.group(1) not in commands:
                    continue
                flags = {o for a in commands[m.group(1)]._actions for o in a.option_strings}
                for tok in m.group(2).split():
                    flag = tok.split("=")[0].rstrip(".,;:)]")
                    if not tok.startswith("--") or tok.endswith("*") or "/" in flag:
                        continue  # a value, a pattern (--writeback.*) or a list of spellings
                    seen += 1
                    if flag not in flags:
                        bad.append(f"{path.relative_to(ROOT)}: {flag} in {m.group(0).strip()}")
    assert seen > 100, seen  # the scan finds the suggestions at all (153 when written)
    assert not bad, "\n".join(bad)
