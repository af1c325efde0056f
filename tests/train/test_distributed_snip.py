"""SNIP on two ranks (DDP or FSDP): every rank measures the same (global) calibration batch
and gets the same plan -- the plan of one process on the same global batch. Under FSDP the
statistics run on a gathered whole copy of the model and optimizer.

Only the first plan is compared with one process: its warm-up (bf16, round-to-nearest) trains
the same weights on two ranks as on one. After it the FP4 candidate rounds gradients
stochastically with per-rank noise, so later statistics differ from one process's by that noise
(the ranks still agree with each other, which is what the run needs)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from snip.plan import PrecisionPlan
from snip.train import from_sources, train
from snip.train.loop import Hook, Trainer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RecordPlans(Hook):
    """Writes every plan this rank switches to into ``out`` (JSON lines)."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def on_plan_change(self, trainer: Trainer, step: int, plan: PrecisionPlan) -> None:
        with self.out.open("a") as f:
            f.write(json.dumps({"step": step, "plan": _formats(plan)}) + "\n")


def _formats(plan: PrecisionPlan) -> dict:
    d = plan.to_dict()
    return {"default": d["default"], "layers": d["layers"]}


def _worker(rank: int, world: int, port: int, overrides: dict, out: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    train(from_sources(overrides=overrides), hooks=[RecordPlans(Path(out) / f"rank{rank}.jsonl")])


def _plans(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_ranks_get_the_single_process_plan(tiny: dict, tmp_path: Path, strategy: str) -> None:
    settings = {**tiny, "model.name": "tiny-deep", "train.steps": 5, "train.eval_every": 5,
                "train.ckpt_every": 5, "precision.mode": "adaptive", "precision.warmup": 2,
                "precision.every": 2, "precision.budget": 0.5, "precision.preset": "bf16"}
    train(from_sources(overrides={**settings, "run.name": "one"}),
          hooks=[RecordPlans(tmp_path / "one.jsonl")])
    split = {**settings, "run.name": strategy, "dist.strategy": strategy}
    mp.spawn(_worker, args=(2, _free_port(), split, str(tmp_path)), nprocs=2, join=True)
    one = _plans(tmp_path / "one.jsonl")
    rank0, rank1 = _plans(tmp_path / "rank0.jsonl"), _plans(tmp_path / "rank1.jsonl")
    assert [p["step"] for p in one] == [2, 4]
    assert rank0 == rank1
    assert [p["step"] for p in rank0] == [2, 4]
    assert rank0[0] == one[0]
    # the plan is a real choice: some layers in FP4, some not
    formats = {json.dumps(v, sort_keys=True) for v in one[0]["plan"]["layers"].values()}
    assert len(formats) > 1
