"""TOML lists where the value is a list: ``candidates = ["bf16", "mxfp4"]``."""

from __future__ import annotations

from pathlib import Path

import pytest

from snip.errors import UserError
from snip.train import from_sources


def test_candidates_as_a_toml_list(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('[precision]\ncandidates = ["fp8_e4m3_tile128", "fp4_e2m1_tile128"]\n')
    pair = ("fp8_e4m3_tile128", "fp4_e2m1_tile128")
    assert from_sources(f).precision.candidates == pair
    f.write_text('[precision]\ncandidates = "fp8_e4m3_tile128, fp4_e2m1_tile128"\n')  # as before
    assert from_sources(f).precision.candidates == pair
    assert from_sources(overrides={"precision.candidates": ",".join(pair)}).precision.candidates \
        == pair  # the command line's NAME,NAME
    f.write_text('[precision]\ncandidates = ["fp8_e4m3_tile128", 3]\n')
    with pytest.raises(UserError, match="precision.candidates expects a list of names"):
        from_sources(f)


def test_modes_are_enums_written_as_their_values(tmp_path: Path) -> None:
    from snip.nn import GemmImpl
    from snip.train import config as C
    from snip.train.distributed import MixedPrecision, Strategy
    from snip.train.schedule import Shape

    cfg = from_sources(overrides={"precision.mode": "fixed", "train.schedule": "wsd",
                                  "precision.gemm": "native", "dist.strategy": "fsdp",
                                  "dist.mixed_precision": "bf16", "writeback.policy": "eco",
                                  "precision.candidates": "bf16,mxfp4"})
    assert cfg.precision.mode is C.PrecisionMode.FIXED and cfg.train.schedule is Shape.WSD
    assert cfg.precision.gemm is GemmImpl.NATIVE and cfg.dist.strategy is Strategy.FSDP
    assert cfg.dist.mixed_precision is MixedPrecision.BF16
    assert cfg.writeback.policy is C.WritebackPolicy.ECO
    C.write_toml(cfg, tmp_path / "config.toml")
    text = (tmp_path / "config.toml").read_text()
    assert 'mode = "fixed"' in text and 'candidates = ["bf16", "mxfp4"]' in text
    assert C.load(tmp_path / "config.toml") == cfg  # read back equal
    flat = C.flatten(C.to_dict(cfg))
    assert flat["writeback.policy"] == "eco" and flat["precision.candidates"] == ["bf16", "mxfp4"]
    # a library caller may give the values as strings; a bad one names the key and the choices
    assert C.DistSection(strategy="fsdp").strategy is Strategy.FSDP
    with pytest.raises(UserError, match="dist.strategy must be one of ddp, fsdp; got 'tp'"):
        C.DistSection(strategy="tp")
    leaf = C.leaf_map()["writeback.policy"]
    assert leaf.choices == C.WRITEBACK_POLICIES and leaf.choices[0] == "none"


def test_a_list_where_one_value_is_meant_is_still_an_error(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('[precision]\npreset = ["bf16", "mxfp4"]\n')
    with pytest.raises(UserError, match="precision.preset expects str"):
        from_sources(f)
