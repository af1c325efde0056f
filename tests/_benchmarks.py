"""A benchmark script loaded as a module, for the tests of its parts.

The scripts in ``benchmarks/`` are run as files, not imported as a package: a test loads one
by path.  The module is registered under its name in ``sys.modules`` (a dataclass looks its
module up there) and the repository root is put on ``sys.path`` (scripts import
``benchmarks._util`` and each other as they do when run from the root)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load(script: str, name: str) -> ModuleType:
    """``benchmarks/<script>.py`` as the module ``name``."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
