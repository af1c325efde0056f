"""Exact-budget masks, controls, and the mask file round trip."""

from __future__ import annotations

import math

import numpy as np
import pytest

from snip.audit import layer_mask, mask_from_scores, matched_random_mask, random_mask
from snip.optim import TileMask, tile_lengths

SHAPES = {"a": (10, 77), "b": (33, 16), "c": (5, 5)}


@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.137, 0.5, 1.0])
@pytest.mark.parametrize("tile", [7, 64, 768])
def test_every_mask_has_exactly_the_budget(fraction, tile):
    total = sum(math.prod(s) for s in SHAPES.values())
    rng = np.random.default_rng(0)
    scores = {n: rng.random(len(tile_lengths(math.prod(s), tile))) for n, s in SHAPES.items()}
    for m in (mask_from_scores(scores, SHAPES, fraction, tile_size=tile),
              random_mask(SHAPES, fraction, tile_size=tile, seed=1),
              layer_mask(SHAPES, fraction, tile_size=tile)):
        assert m.protected == round(fraction * total)
        assert sum(int(m.dense(n).sum()) for n in SHAPES) == m.protected


def test_top_tiles_and_deterministic_ties():
    shapes = {"x": (4, 8), "y": (4, 8)}
    scores = {"x": [1.0, 5.0, 1.0, 1.0], "y": [1.0, 1.0, 5.0, 1.0]}
    m = mask_from_scores(scores, shapes, 0.5, tile_size=8)
    # the two 5.0 tiles, then ties (1.0) by parameter order, then tile index
    assert m.tiles == {"x": ((0, 8), (1, 8), (2, 8)), "y": ((2, 8),)}


def test_mask_file_round_trip_and_check(tmp_path):
    m = random_mask(SHAPES, 0.2, tile_size=16, seed=3)
    back = TileMask.load(m.save(tmp_path / "m.json"))
    assert back == m
    back.check(SHAPES)
    with pytest.raises(ValueError, match="different model"):
        back.check({**SHAPES, "c": (5, 6)})
    with pytest.raises(ValueError, match="different model"):
        back.check({"a": (10, 77)})


def test_bad_fraction():
    with pytest.raises(ValueError, match="0.1 for 10"):
        random_mask(SHAPES, 10)


@pytest.mark.parametrize("tile", [7, 16, 64])
def test_matched_random_keeps_the_reference_composition(tile):
    rng = np.random.default_rng(0)
    scores = {n: rng.random(len(tile_lengths(math.prod(s), tile))) ** (3 if n == "a" else 1)
              for n, s in SHAPES.items()}
    ref = mask_from_scores(scores, SHAPES, 0.3, tile_size=tile)
    draws = [matched_random_mask(ref, seed=k) for k in range(10)]
    for m in draws:
        assert m.protected == ref.protected and m.tile_size == tile
        for n in SHAPES:  # the same coordinates and tiles in every tensor, other tiles
            assert int(m.dense(n).sum()) == int(ref.dense(n).sum())
            assert len(m.tiles.get(n, ())) == len(ref.tiles.get(n, ()))
    assert matched_random_mask(ref, seed=3) == draws[3]  # reproducible
    assert len({tuple(sorted(m.tiles["a"])) for m in draws}) > 1  # and random
