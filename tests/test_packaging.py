"""What a packaged `snip` carries: its license text, the typing marker, honest bounds."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_license_file_matches_the_declared_license() -> None:
    assert _project()["project"]["license"] == {"text": "Apache-2.0"}
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in text


def test_py_typed_ships_with_the_package() -> None:
    assert (ROOT / "src" / "snip" / "py.typed").is_file()
    assert "py.typed" in _project()["tool"]["setuptools"]["package-data"]["snip"]


def test_torch_bound_covers_the_public_fsdp2_api() -> None:
    """snip.train.distributed imports fully_shard/FSDPModule from torch.distributed.fsdp,
    public from torch 2.6 on; the declared lower bound must not promise less."""
    source = (ROOT / "src" / "snip" / "train" / "distributed.py").read_text()
    assert "from torch.distributed.fsdp import" in source and "fully_shard" in source
    torch_dep = next(d for d in _project()["project"]["dependencies"] if d.startswith("torch"))
    major, minor = map(int, re.fullmatch(r"torch>=(\d+)\.(\d+)", torch_dep).groups())
    assert (major, minor) >= (2, 6)


def test_hf_extra_has_what_the_trainer_needs() -> None:
    hf = _project()["project"]["optional-dependencies"]["hf"]
    assert any(d.startswith("transformers") for d in hf)
    assert any(d.startswith("accelerate") for d in hf)  # transformers.Trainer requires it
