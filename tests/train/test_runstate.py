"""snip.train.runstate: the layout chosen per run, and the typed checkpoint metadata it saves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from snip.errors import UserError
from snip.train import checkpoint, from_sources, runstate, train
from snip.train.distributed import DistInfo, Strategy


@pytest.mark.parametrize(("world", "strategy", "want"), [
    (1, Strategy.DDP, runstate.Replicated), (1, Strategy.FSDP, runstate.Replicated),
    (2, Strategy.DDP, runstate.Replicated), (2, Strategy.FSDP, runstate.Sharded)])
def test_layout_is_sharded_only_for_fsdp_across_ranks(world: int, strategy: Strategy,
                                                       want: type) -> None:
    dist = DistInfo(rank=0, local_rank=0, world_size=world)
    assert runstate.layout(dist, strategy) is want


def test_sharded_layout_refuses_what_it_cannot_run(tiny: dict) -> None:
    cfg = from_sources(overrides={**tiny, "writeback.policy": "eco"})
    runstate.Replicated.check(cfg)  # whole tensors: eco is fine
    with pytest.raises(UserError, match="writeback.policy=eco is not supported with"):
        runstate.Sharded.check(cfg)


def test_checkpoint_meta_is_a_typed_record(tiny: dict) -> None:
    train(from_sources(overrides={**tiny, "train.steps": 6}))
    path = checkpoint.find(Path(tiny["run.dir"]) / "tiny")
    meta = checkpoint.load(path).meta
    assert isinstance(meta, checkpoint.Meta)
    assert meta.tokenizer.startswith("ByteTokenizer:")
    assert (meta.vocab_size, meta.world_size, meta.strategy, meta.skipped) == (256, 1, "none", 0)
    assert meta.model["dim"] == 64 and meta.schedule is not None
    raw = json.loads((path / "meta.json").read_text())
    assert checkpoint.Meta.from_dict(raw) == meta  # what is written is what is read
    assert (path / checkpoint.TOKENIZER_FILE).is_file() and "tokenizer_spec" not in raw


def test_meta_of_an_older_checkpoint_reads_its_defaults() -> None:
    old = checkpoint.Meta.from_dict({"model": {"dim": 8}, "tokenizer": "byte", "step": 3})
    assert old == checkpoint.Meta(model={"dim": 8}, tokenizer="byte", vocab_size=0)
