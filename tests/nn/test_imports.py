"""`snip.nn`'s modules import one way: specs -> native -> gemm -> qlinear -> diagnostics (and
convert above them), with no import, at the top or inside a function, back up that chain."""

from __future__ import annotations

import ast
from pathlib import Path

import snip.nn

ORDER = ["specs", "native", "gemm", "qlinear", "diagnostics"]


def _imported_nn_modules(name: str) -> set[str]:
    tree = ast.parse((Path(snip.nn.__file__).parent / f"{name}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("snip.nn."):
            found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[2] for a in node.names if a.name.startswith("snip.nn.")}
    return found


def test_no_module_imports_one_above_it() -> None:
    for i, name in enumerate(ORDER):
        above = set(ORDER[i + 1:]) | {"convert", "conv1d"}
        assert not (_imported_nn_modules(name) & above), name
