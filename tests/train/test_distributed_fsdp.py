"""FSDP2 (``--dist.strategy fsdp``) on two CPU processes (gloo) equals one process.

The same global batch, split over two ranks, gives the losses and final weights of one process
within float tolerance (reduce-scatter sums in another order than one GEMM), with quantized
GEMMs (mxfp4, and a mixed fp8/fp4 plan) that see the all-gathered whole weight. Sharded
checkpoints (torch.distributed.checkpoint) resume in another world size: 2 ranks -> 1 process
and 1 process -> 2 ranks continue the single-process run.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from snip.cli import main
from snip.errors import UserError
from snip.plan import PrecisionPlan
from snip.train import checkpoint, from_sources, train
from snip.train.metrics import read_metrics


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, overrides: dict, resume: str | None,
            until: int | None) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    train(from_sources(overrides=overrides, resume=resume), resume=resume, until=until)


def two_ranks(overrides: dict, resume: str | None = None, until: int | None = None) -> None:
    mp.spawn(_worker, args=(2, _free_port(), overrides, resume, until), nprocs=2, join=True)


def one_process(overrides: dict, resume: str | None = None, until: int | None = None) -> None:
    train(from_sources(overrides=overrides, resume=resume), resume=resume, until=until)


def losses(run: Path) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in read_metrics(run / "metrics.jsonl")
            if e["event"] == "train"}


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    last = checkpoint.list_checkpoints(run / "checkpoints")[-1]
    return load_file(str(last / "model.safetensors"))


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


def test_fsdp_two_ranks_match_one_process(tiny: dict, tmp_path: Path,
                                          capsys: pytest.CaptureFixture) -> None:
    """Round-to-nearest quantized GEMMs (a per-layer, per-GEMM mixed mxfp4/mxfp8 plan): the
    losses and final weights of one process, to float tolerance."""
    settings = _settings(tiny, {"precision.plan": mixed_plan(tmp_path / "mixed.json")})
    one_process({**settings, "run.name": "one"})
    two_ranks({**settings, "run.name": "fsdp", "dist.strategy": "fsdp"})
    runs = Path(tiny["run.dir"])
    one, two = losses(runs / "one"), losses(runs / "fsdp")
    assert sorted(one) == sorted(two) == [1, 2, 3, 4]
    assert list(two.values()) == pytest.approx(list(one.values()), rel=1e-5)
    w1, w2 = final_weights(runs / "one"), final_weights(runs / "fsdp")
    assert set(w1) <= set(w2)  # (the consolidated file stores a tied matrix twice)
    assert max((w1[k] - w2[k]).abs().max().item() for k in w1) < 1e-5
    # the checkpoint is sharded, verified by its manifest, and refuses another model shape
    ckpt = checkpoint.load(checkpoint.find(runs / "fsdp"))
    assert ckpt.sharded and ckpt.meta["strategy"] == "fsdp" and ckpt.meta["world_size"] == 2
    assert any(name.startswith("sharded/") for name in ckpt.meta["files"])
    other = {**settings, "run.name": "other", "model.name": "tiny-deep", "dist.strategy": "ddp"}
    with pytest.raises(UserError, match="different model shape"):
        train(from_sources(overrides=other, init_from=ckpt.path), init_from=ckpt.path)
    assert main(["train", "--resume", str(runs / "fsdp"), "--dist.strategy", "ddp",
                 "--model.name", "tiny-deep"]) == 2
    assert "it holds a different model shape (n_layers=2" in capsys.readouterr().err


def test_fsdp_mxfp4_matches_ddp_and_one_process(tiny: dict) -> None:
    """mxfp4 rounds gradients stochastically; each rank places its tokens in the global batch
    (``QLinear.tokens``), so it draws the coins one process draws for those tokens: FSDP and
    DDP on two ranks and one process with two micro-batches all match one process to float
    tolerance (the reductions sum in another order)."""
    settings = _settings(tiny, {"precision.preset": "mxfp4"})
    one_process({**settings, "run.name": "one"})
    one_process({**settings, "run.name": "accum", "train.grad_accum": 2})
    two_ranks({**settings, "run.name": "fsdp", "dist.strategy": "fsdp"})
    two_ranks({**settings, "run.name": "ddp", "dist.strategy": "ddp"})
    runs = Path(tiny["run.dir"])
    one = losses(runs / "one")
    w_one = final_weights(runs / "one")
    for name in ("accum", "fsdp", "ddp"):
        got = losses(runs / name)
        assert sorted(got) == sorted(one) == [1, 2, 3, 4]
        assert list(got.values()) == pytest.approx(list(one.values()), rel=1e-5), name
        w = final_weights(runs / name)
        assert max((w_one[k] - w[k]).abs().max().item() for k in w_one) < 1e-5, name


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
    ref, got = losses(runs / "ref"), losses(runs / "split")
    assert sorted(got) == list(range(1, 7))
    assert [got[s] for s in range(1, 7)] == pytest.approx([ref[s] for s in range(1, 7)],
                                                          rel=1e-5)
    w_ref, w_got = final_weights(runs / "ref"), final_weights(runs / "split")
    assert max((w_ref[k] - w_got[k]).abs().max().item() for k in w_ref) < 1e-5


def test_fsdp_without_a_process_group_is_a_user_error(tiny: dict) -> None:
    cfg = from_sources(overrides={**tiny, "dist.strategy": "fsdp"})
    with pytest.raises(UserError, match="needs a process group of 2 or more ranks"):
        train(cfg)
    assert not (Path(tiny["run.dir"]) / "tiny").exists()  # refused before anything is written
