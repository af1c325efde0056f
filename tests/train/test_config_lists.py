"""TOML lists where the value is a list: ``candidates = ["bf16", "mxfp4"]``."""

from __future__ import annotations

from pathlib import Path

import pytest

from snip.errors import UserError
from snip.train import from_sources


def test_candidates_as_a_toml_list(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('[precision]\ncandidates = ["fp8_e4m3_tile128", "fp4_e2m1_tile128"]\n')
    assert from_sources(f).precision.candidates == "fp8_e4m3_tile128,fp4_e2m1_tile128"
    f.write_text('[precision]\ncandidates = "fp8_e4m3_tile128,fp4_e2m1_tile128"\n')  # as before
    assert from_sources(f).precision.candidates == "fp8_e4m3_tile128,fp4_e2m1_tile128"


def test_a_list_where_one_value_is_meant_is_still_an_error(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('[precision]\npreset = ["bf16", "mxfp4"]\n')
    with pytest.raises(UserError, match="precision.preset expects str"):
        from_sources(f)
