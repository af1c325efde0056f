"""Row shards (``quantize(..., shard=RowShard(start, total))``): a tensor that is some rows of a
larger one draws, under stochastic rounding, exactly the coins the larger tensor draws there.

So ranks that each quantize their own tokens round like one process quantizing all of them:
``quantize(whole)[a:b] == quantize(whole[a:b], shard=RowShard(a, len(whole)))``, bit for bit,
on the fused numba kernels and on the PyTorch path, along either axis, whenever the shard's
block scales are the whole tensor's (blocks that do not straddle the shard's edges).
"""

from __future__ import annotations

import pytest
import torch

from snip.formats import cast, encode, fast, get_spec, quantize
from snip.formats.cast import Counters
from snip.formats.scaling import RowShard

PATHS = ["fast", "torch"]


def _path(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if path == "torch":
        monkeypatch.setattr(fast, "enabled", lambda: False)
    else:
        monkeypatch.setattr(fast, "_PARALLEL_MIN", 0)  # exercise the parallel split too


def whole(rows: int = 256, cols: int = 96, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=g) * torch.logspace(-2, 2, cols)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("preset,axis", [("mxfp4", -1), ("mxfp4", 0), ("mxfp8_e4m3", 0),
                                         ("fp8_e4m3_tile128", -1), ("int4_g32", 0),
                                         ("int4_g32", -1), ("int8", -1),
                                         ("mxfp4_rht", 0), ("mxfp4_rht", -1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_shard_draws_the_whole_tensors_coins(path: str, preset: str, axis: int,
                                               dtype: torch.dtype,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    _path(path, monkeypatch)
    x = whole().to(dtype)
    full = quantize(x, preset, axis=axis, rounding="stochastic", generator=7)
    for a, b in [(0, 64), (64, 192), (192, 256)]:
        part = quantize(x[a:b], preset, axis=axis, rounding="stochastic", generator=7,
                        shard=RowShard(a, 256))
        assert torch.equal(part, full[a:b]), (a, b)
    # without the shard the rows draw the coins of rows 0..: another rounding
    alone = quantize(x[64:192], preset, axis=axis, rounding="stochastic", generator=7)
    assert not torch.equal(alone, full[64:192])


@pytest.mark.parametrize("path", PATHS)
def test_padded_blocks_along_the_shard_axis(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Axis 0 of 80 rows in blocks of 32: the whole tensor's rows pad to 96; shards of 32 rows
    each hold whole blocks, the last one (16 rows) pads like the whole tensor's last block."""
    _path(path, monkeypatch)
    x = whole(80, 40, seed=1)
    full = quantize(x, "mxfp4", axis=0, rounding="stochastic", generator=3)
    for a, b in [(0, 32), (32, 64), (64, 80)]:
        part = quantize(x[a:b], "mxfp4", axis=0, rounding="stochastic", generator=3,
                        shard=RowShard(a, 80))
        assert torch.equal(part, full[a:b])


@pytest.mark.parametrize("path", PATHS)
def test_tensor_scaled_and_unscaled_shards(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One tensor scale is the shard's own amax: with the same amax in every shard (a planted
    maximum) the shards round like the whole; unscaled casts follow the element order."""
    _path(path, monkeypatch)
    x = whole(128, 48, seed=2).clamp(-9, 9)
    x[0, 0] = x[64, 5] = 10.0
    full = quantize(x, "fp4_e2m1_tensor", rounding="stochastic", generator=5)
    for a, b in [(0, 64), (64, 128)]:
        part = quantize(x[a:b], "fp4_e2m1_tensor", rounding="stochastic", generator=5,
                        shard=RowShard(a, 128))
        assert torch.equal(part, full[a:b])
    fullc = cast(x, "e2m1", "stochastic", generator=5)
    partc = cast(x[64:], "e2m1", "stochastic", generator=5, counters=Counters(offset=64 * 48))
    assert torch.equal(partc, fullc[64:])


def test_encode_takes_the_shard_too() -> None:
    x = whole(128, 64, seed=3)
    shard = RowShard(64, 128)
    q = encode(x[64:], "mxfp4", axis=0, rounding="stochastic", generator=9, shard=shard)
    assert torch.equal(q.dequantize(), quantize(x, "mxfp4", axis=0, rounding="stochastic",
                                                generator=9)[64:])


def test_a_trivial_shard_is_no_shard_and_bad_shards_are_refused() -> None:
    x = whole(64, 64, seed=4)
    assert torch.equal(quantize(x, "mxfp4", axis=0, rounding="stochastic", generator=1,
                                shard=RowShard(0, 64)),
                       quantize(x, "mxfp4", axis=0, rounding="stochastic", generator=1))
    with pytest.raises(ValueError, match="do not fit"):
        quantize(x, "mxfp4", rounding="stochastic", generator=1, shard=RowShard(32, 64))
    tiles = get_spec("nvfp4").for_weight()
    with pytest.raises(ValueError, match="2-D tiles"):
        quantize(x, tiles, rounding="stochastic", generator=1, shard=RowShard(64, 128))
    # round-to-nearest draws no coins: any shard is accepted and changes nothing
    assert torch.equal(quantize(x, tiles, shard=RowShard(64, 128)), quantize(x, tiles))


def test_counters_map() -> None:
    c = Counters(offset=5, row=4, stride=10)
    assert c.index(9, "cpu").tolist() == [5, 6, 7, 8, 15, 16, 17, 18, 25]
    assert Counters(offset=0, row=4, stride=4).index(9, "cpu").tolist() == list(range(9))
    with pytest.raises(ValueError):
        Counters(row=4, stride=2)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("preset", ["int8", "fp8_e4m3_tile128", "mxfp4"])
def test_odd_counter_offsets(path: str, preset: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An odd first counter splits an element pair's hash between two shards."""
    _path(path, monkeypatch)
    x = whole(77, 95, seed=6)  # rows of 95 (int8) or padded to 96 / 128 elements
    full = quantize(x, preset, rounding="stochastic", generator=11)
    for a, b in [(0, 33), (33, 34), (34, 77)]:
        part = quantize(x[a:b], preset, rounding="stochastic", generator=11,
                        shard=RowShard(a, 77))
        assert torch.equal(part, full[a:b]), (a, b)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("preset", ["fp4_e2m1_tensor", "fp8_e4m3"])
def test_odd_counter_offsets_one_tensor_scale(path: str, preset: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _path(path, monkeypatch)
    x = whole(77, 95, seed=7).clamp(-9, 9)
    x[0, 0] = x[33, 1] = x[34, 2] = 10.0  # every shard holds the tensor's amax
    full = quantize(x, preset, rounding="stochastic", generator=12)
    for a, b in [(0, 33), (33, 34), (34, 77)]:
        part = quantize(x[a:b], preset, rounding="stochastic", generator=12,
                        shard=RowShard(a, 77))
        assert torch.equal(part, full[a:b]), (a, b)
