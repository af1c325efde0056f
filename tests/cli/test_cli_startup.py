"""CLI start-up: commands are discovered from source, and only the one being run is imported."""

from __future__ import annotations

import importlib
import subprocess
import sys

from snip.cli import build_parser, commands


def test_discovered_names_and_help_match_the_modules():
    found = commands()
    assert {"train", "formats", "plan", "report", "audit"} <= set(found)
    for name, info in found.items():
        mod = importlib.import_module(info.module)
        assert (mod.COMMAND, mod.HELP) == (name, info.help)
        assert callable(mod.add_arguments) and callable(mod.run)


def test_full_parser_still_builds():
    args = build_parser().parse_args(["formats", "--json"])
    assert args.command == "formats" and args.json


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\nprint(*sys.modules)"],
                         capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_help_imports_no_subcommand_module():
    mods = _modules_after("from snip.cli import main\n"
                          "try:\n    main(['--help'])\nexcept SystemExit:\n    pass")
    assert not {m for m in mods if m.startswith("snip.cli.")}
    assert "snip.train" not in mods


def test_formats_imports_no_torch_beyond_the_package():
    """``snip formats`` itself needs no torch; ``import snip`` may (that is the package's own
    ``__init__``), so compare against a bare ``import snip``."""
    base = _modules_after("import snip")
    mods = _modules_after("import snip\nfrom snip.cli import main\nmain(['formats'])")
    assert "snip.cli.train" not in mods
    if "torch" not in base:
        assert "torch" not in mods
