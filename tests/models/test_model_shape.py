"""``model.dim``, ``model.n_layers``, ... : any shape trains from a named one."""

from __future__ import annotations

from pathlib import Path

import pytest

from snip.errors import UserError
from snip.train import from_sources, train
from snip.train.config import build, read_toml_text, to_toml


def test_shape_keys_replace_the_named_shape(tmp_path: Path) -> None:
    cfg = from_sources(overrides={"model.name": "tiny", "model.n_layers": 3, "model.dim": 96,
                                  "model.n_heads": 4, "model.n_kv_heads": 4,
                                  "model.ffn_dim": 128, "train.steps": 2, "train.batch_size": 2,
                                  "train.seq_len": 16, "train.eval_every": 2,
                                  "train.eval_batches": 1, "log.progress": False,
                                  "run.dir": str(tmp_path), "run.name": "shape"})
    assert cfg.model.shape() == {"dim": 96, "n_layers": 3, "n_heads": 4, "n_kv_heads": 4,
                                 "ffn_hidden": 128}
    # the TOML model section round-trips the shape
    assert build(read_toml_text(to_toml(cfg))).model == cfg.model
    train(cfg)
    import json

    saved = json.loads((tmp_path / "shape" / "checkpoints" / "step_000002" /
                        "meta.json").read_text())["model"]
    assert (saved["dim"], saved["n_layers"], saved["ffn_hidden"]) == (96, 3, 128)


def test_unset_shape_keys_keep_the_named_model() -> None:
    assert from_sources(overrides={"model.name": "small-deep"}).model.shape() == {}


@pytest.mark.parametrize("key, value, message", [
    ("model.dim", 98, "divisible by n_heads"), ("model.n_layers", -1, ">= 0"),
    ("model.n_kv_heads", 3, "divisible by n_kv_heads")])
def test_bad_shape_is_a_user_error(key: str, value: int, message: str) -> None:
    with pytest.raises(UserError, match=message):
        from_sources(overrides={"model.name": "tiny", key: value})
