"""Config: dataclass validation, TOML round trip, override order, misspelling suggestions."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from snip.train import config as C


def test_defaults_validate_and_round_trip_through_toml(tmp_path: Path) -> None:
    cfg = C.resolve(C.Config())
    C.write_toml(cfg, tmp_path / "config.toml")
    assert C.load(tmp_path / "config.toml") == cfg
    assert tomllib.loads(C.to_toml(cfg))["train"]["steps"] == cfg.train.steps


def test_sections_are_frozen_and_keyword_only() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        C.TrainSection().steps = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        C.TrainSection(10)  # type: ignore[misc]


@pytest.mark.parametrize("key, value, match", [
    ("train.steps", 0, "train.steps must be > 0"),
    ("train.steps", -5, "train.steps must be > 0"),
    ("train.lr", -1.0, "train.lr"),
    ("precision.mode", "sometimes", "precision.mode must be one of"),
    ("precision.preset", "mxfp5", "unknown quantization preset"),
    ("model.name", "smal", "did you mean 'small'"),
    ("train.steps", "many", "train.steps expects int"),
])
def test_bad_values_name_the_key(key: str, value: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        C.build({key: value})


def test_misspelt_key_suggests_the_closest() -> None:
    with pytest.raises(ValueError, match="did you mean 'train.steps'"):
        C.build({"trian.steps": 3})


def test_flags_override_file_which_overrides_defaults(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('seed = 7\n[train]\nsteps = 50\nlr = 1e-3\n[model]\nname = "tiny"\n')
    cfg = C.from_sources(f, {"train.steps": "20"})
    assert (cfg.seed, cfg.train.steps, cfg.train.lr, cfg.model.name) == (7, 20, 1e-3, "tiny")
    f.write_text("[train]\nstesp = 5\n")
    with pytest.raises(ValueError, match="did you mean 'train.steps'"):
        C.from_sources(f)


def test_precision_resolution() -> None:
    cfg = C.from_sources(overrides={})
    assert cfg.precision.mode is C.PrecisionMode.ADAPTIVE
    assert cfg.precision.preset == C.DEFAULT_PRESET
    # naming a preset means "use exactly this", whatever the default mode
    fixed = C.from_sources(overrides={"precision.preset": "mxfp4"})
    assert fixed.precision.mode is C.PrecisionMode.FIXED
    with pytest.raises(ValueError, match="either precision.preset or precision.plan"):
        C.from_sources(overrides={"precision.preset": "mxfp4", "precision.plan": "p.json"})


def test_every_leaf_has_help() -> None:
    for leaf in C.leaves():
        assert leaf.help, leaf.key
    assert {"seed", "train.steps", "run.name", "run.dir", "data.path", "model.name",
            "precision.preset", "precision.plan"} <= set(C.leaf_map())


def test_example_configs_build_and_can_be_rerun() -> None:
    """Every configs/*.toml is a valid config and names no run (a re-run gets a fresh name
    instead of refusing to overwrite the last one)."""
    from snip.train import from_sources

    files = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.toml"))
    assert files
    for f in files:
        assert "run.name" not in C.read_toml(f), f
        assert from_sources(f).run.name  # generated
