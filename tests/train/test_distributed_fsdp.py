"""FSDP2 (``--dist.strategy fsdp``) on two CPU processes (gloo) against one process.

What is guaranteed, and so asserted (see ``parity.py`` for why each holds on any x86-64 CPU):
the first step's loss and gradients equal one process with two micro-batches (``grad_accum``
2) bit for bit; the trajectory stays within the measured spread, with quantized GEMMs (mxfp4,
and a mixed fp8/fp4 plan) that see the all-gathered whole weight.  Sharded checkpoints
(torch.distributed.checkpoint) resume in another world size: 2 ranks -> 1 process and
1 process -> 2 ranks continue the single-process run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from parity import (
    assert_bitwise,
    assert_first_loss_equal,
    assert_same_trajectory,
    final_weights,
    losses,
    one_process,
    two_ranks,
)
from safetensors.torch import load_file, save_file

from snip.cli import main
from snip.errors import UserError
from snip.plan import PrecisionPlan
from snip.train import checkpoint, from_sources, train
from snip.train.loop import Hook, Trainer

__all__ = ["final_weights", "losses", "one_process", "two_ranks"]  # used by sibling modules


def mixed_plan(path: Path) -> str:
    """Per-layer and per-GEMM mixed, all round-to-nearest: mxfp8 in the attention projections,
    elsewhere mxfp4 forward GEMMs with mxfp8 gradient GEMMs."""
    plan = PrecisionPlan.from_table(
        {"re:.*attention.*": "mxfp8_e4m3"},
        default={"fprop": "mxfp4", "dgrad": "mxfp8_e4m3", "wgrad": "mxfp8_e4m3"})
    plan.to_json(path)
    return str(path)


def _settings(tiny: dict, precision: dict) -> dict:
    return {**tiny, "train.steps": 4, "train.eval_every": 4, "train.ckpt_every": 4,
            "precision.mode": "fixed", **precision}


class SaveFirstGradients(Hook):
    """Writes every parameter's whole gradient before the first update to ``path`` (rank 0)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def before_update(self, trainer: Trainer) -> None:
        if trainer.step_count != 0:
            return
        grads = {}
        for name, p in trainer.model.named_parameters():
            g = p.grad
            full = g.full_tensor() if hasattr(g, "full_tensor") else g  # a collective on FSDP
            grads[name] = full.detach().clone()
        if trainer.dist.rank == 0:
            save_file(grads, str(self.path))


def test_fsdp_two_ranks_match_one_process(tiny: dict, tmp_path: Path,
                                          capsys: pytest.CaptureFixture) -> None:
    """Round-to-nearest quantized GEMMs (a per-layer, per-GEMM mixed mxfp4/mxfp8 plan): the
    first step's gradients of two FSDP ranks equal one process with two micro-batches bit for
    bit (a two-rank reduce-scatter of halved gradients is exact), the trajectory stays within
    the measured spread of one process with one or two micro-batches."""
    settings = {**_settings(tiny, {"precision.plan": mixed_plan(tmp_path / "mixed.json")}),
                "train.grad_clip": 0.0}  # the clip norm of shards sums in another order
    one_process({**settings, "run.name": "one"})
    one_process({**settings, "run.name": "accum", "train.grad_accum": 2},
                hooks=[SaveFirstGradients(tmp_path / "g_one.st")])
    two_ranks({**settings, "run.name": "fsdp", "dist.strategy": "fsdp"},
              hooks=[SaveFirstGradients(tmp_path / "g_fsdp.st")])
    g_one, g_fsdp = load_file(str(tmp_path / "g_one.st")), load_file(str(tmp_path / "g_fsdp.st"))
    assert set(g_one) == set(g_fsdp) and len(g_one) > 0
    for k in g_one:
        assert torch.equal(g_one[k], g_fsdp[k]), k
    runs = Path(tiny["run.dir"])
    assert sorted(losses(runs / "fsdp")) == [1, 2, 3, 4]
    assert_first_loss_equal(runs / "accum", runs / "fsdp")
    assert_same_trajectory(runs / "accum", runs / "fsdp")
    assert_same_trajectory(runs / "one", runs / "fsdp")
    # the checkpoint is sharded, verified by its manifest, and refuses another model shape
    ckpt = checkpoint.load(checkpoint.find(runs / "fsdp"))
    assert ckpt.sharded and ckpt.meta.strategy == "fsdp" and ckpt.meta.world_size == 2
    assert any(name.startswith("sharded/") for name in checkpoint.verify(ckpt.path)["files"])
    other = {**settings, "run.name": "other", "model.name": "tiny-deep", "dist.strategy": "ddp",
             "train.steps": 8}
    with pytest.raises(UserError, match="different model shape"):
        train(from_sources(overrides=other, init_from=ckpt.path), init_from=ckpt.path)
    assert main(["train", "--resume", str(runs / "fsdp"), "--dist.strategy", "ddp",
                 "--model.name", "tiny-deep"]) == 2
    assert "it holds a different model shape (n_layers=2" in capsys.readouterr().err


def test_fsdp_mxfp4_matches_ddp_and_one_process(tiny: dict) -> None:
    """mxfp4 rounds gradients stochastically; each rank places its tokens in the global batch
    (``QLinear.tokens``), so it draws the coins one process draws for those tokens: DDP on two
    ranks equals one process with two micro-batches bit for bit (same operations, same order);
    FSDP equals it on the first step and stays within the measured spread after (its clip norm
    sums shard norms), as does one process with one micro-batch (other GEMM shapes)."""
    settings = _settings(tiny, {"precision.preset": "mxfp4"})
    one_process({**settings, "run.name": "one"})
    one_process({**settings, "run.name": "accum", "train.grad_accum": 2})
    two_ranks({**settings, "run.name": "fsdp", "dist.strategy": "fsdp"})
    two_ranks({**settings, "run.name": "ddp", "dist.strategy": "ddp"})
    runs = Path(tiny["run.dir"])
    assert sorted(losses(runs / "accum")) == [1, 2, 3, 4]
    assert_bitwise(runs / "accum", runs / "ddp")
    assert_first_loss_equal(runs / "accum", runs / "fsdp")
    for name in ("fsdp", "one"):
        assert_same_trajectory(runs / "accum", runs / name)


@pytest.mark.slow
@pytest.mark.parametrize("direction", ["2->1", "1->2"])
def test_sharded_resume_in_another_world_size(tiny: dict, tmp_path: Path,
                                              direction: str) -> None:
    plan = mixed_plan(tmp_path / "mixed.json")
    settings = {**_settings(tiny, {"precision.plan": plan}), "train.steps": 6,
                "train.ckpt_every": 3, "train.eval_every": 3}
    one_process({**settings, "run.name": "ref"})
    split = {**settings, "run.name": "split"}
    fsdp = {**split, "dist.strategy": "fsdp"}
    runs = Path(tiny["run.dir"])
    if direction == "2->1":
        two_ranks(fsdp, until=3)
        assert checkpoint.load(checkpoint.find(runs / "split")).sharded
        one_process({**split, "dist.strategy": "ddp"}, resume=str(runs / "split"))
    else:
        one_process(split, until=3)
        two_ranks(fsdp, resume=str(runs / "split"))
        assert checkpoint.load(checkpoint.find(runs / "split")).sharded
    assert sorted(losses(runs / "split")) == list(range(1, 7))
    assert_same_trajectory(runs / "ref", runs / "split")  # 6 steps; RNE plan, few flips


def test_fsdp_without_a_process_group_is_a_user_error(tiny: dict) -> None:
    cfg = from_sources(overrides={**tiny, "dist.strategy": "fsdp"})
    with pytest.raises(UserError, match="needs a process group of 2 or more ranks") as e:
        train(cfg)
    assert "pass --dist.strategy ddp" in str(e.value)  # the flag, as the user would type it
    assert not (Path(tiny["run.dir"]) / "tiny").exists()  # refused before anything is written
