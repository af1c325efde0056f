"""Two CPU processes (gloo) with the same global batch match one process."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from snip.train import from_sources, train
from snip.train.metrics import read_metrics


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, overrides: dict) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    train(from_sources(overrides=overrides))


def _losses(run: Path) -> list[float]:
    return [e["loss"] for e in read_metrics(run / "metrics.jsonl") if e["event"] == "train"]


def test_two_gloo_ranks_match_one_process(tiny: dict) -> None:
    settings = {**tiny, "train.steps": 6, "train.eval_every": 6, "train.ckpt_every": 6,
                "precision.preset": "fp32"}
    single = {**settings, "run.name": "one"}
    train(from_sources(overrides=single))
    double = {**settings, "run.name": "two"}
    mp.spawn(_worker, args=(2, _free_port(), double), nprocs=2, join=True)
    runs = Path(tiny["run.dir"])
    one, two = _losses(runs / "one"), _losses(runs / "two")
    assert len(one) == len(two) == 6
    assert two == pytest.approx(one, rel=1e-5, abs=1e-6)
