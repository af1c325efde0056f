"""Weight write-back under FSDP (snip.optim.shard) follows one process: the policies act on
whole tensors on every rank (same generator, masks on global tiles), AdamW on the shards.

Stochastic write-back to e4m3 can flip on a last-bit difference (FSDP's shard-wise clip norm
and AdamW), so the runs are compared within the measured spread of ``parity.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from parity import assert_same_trajectory, final_weights, losses, one_process, two_ranks

from snip.formats import cast
from snip.models import build_model
from snip.optim import DEFAULT_TILE_SIZE, TileMask, eligible_parameters
from snip.optim.mask import tile_lengths
from snip.train import checkpoint


def half_mask(path: Path) -> str:
    """Every other tile of every managed weight of the tiny model keeps an fp32 master."""
    shapes = {n: tuple(p.shape) for n, p in eligible_parameters(build_model("tiny"))}
    tiles = {n: [(i, c) for i, c in enumerate(tile_lengths(torch.Size(s).numel(),
                                                            DEFAULT_TILE_SIZE)) if i % 2 == 0]
             for n, s in shapes.items()}
    TileMask(shapes=shapes, tiles=tiles, fraction=0.5, method="test").save(path)
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["stochastic", "selective_master"])
def test_fsdp_writeback_matches_one_process(tiny: dict, tmp_path: Path, policy: str) -> None:
    settings = {**tiny, "train.steps": 4, "train.eval_every": 4, "train.ckpt_every": 2,
                "precision.mode": "fixed", "precision.preset": "fp32",
                "writeback.policy": policy, "writeback.format": "e4m3"}
    if policy == "selective_master":
        settings["writeback.mask"] = half_mask(tmp_path / "mask.json")
    one_process({**settings, "run.name": "one"})
    two_ranks({**settings, "run.name": "fsdp", "dist.strategy": "fsdp"})
    runs = Path(tiny["run.dir"])
    assert sorted(losses(runs / "fsdp")) == [1, 2, 3, 4]
    assert_same_trajectory(runs / "one", runs / "fsdp")
    w = final_weights(runs / "fsdp")["layers.0.attention.wq.weight"]
    assert torch.equal(cast(w, "e4m3"), w)  # stored on the grid
    ckpt = checkpoint.load(checkpoint.find(runs / "fsdp"))
    assert ckpt.sharded and ckpt.writeback["policy"] == policy and ckpt.writeback["step"] == 4
    # a sharded write-back checkpoint resumes in one process: masters, generator and all
    one_process({**settings, "run.name": "one", "train.steps": 6}, resume=str(runs / "one"))
    one_process({**settings, "run.name": "fsdp", "train.steps": 6, "dist.strategy": "ddp"},
                resume=str(runs / "fsdp"))
    assert sorted(losses(runs / "fsdp")) == [1, 2, 3, 4, 5, 6]
    assert_same_trajectory(runs / "one", runs / "fsdp")
