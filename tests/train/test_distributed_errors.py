"""Bad distributed settings are one-line `snip.UserError`s (exit 2 from the CLI), raised before
any process group is joined or any file is written."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from snip.cli import main

TINY = ["--model.name", "tiny", "--train.steps", "2", "--train.batch_size", "4",
        "--train.seq_len", "16", "--train.threads", "1", "--log.progress", "false",
        "--precision.mode", "fixed"]


def _err(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("argv, env, match", [
    (["--dist.strategy", "fsdp"], {}, "dist.strategy=fsdp needs a process group"),
    (["--dist.strategy", "zero3"], {}, "dist.strategy must be one of ddp, fsdp"),
    (["--dist.mixed_precision", "fp8"], {}, "dist.mixed_precision must be one of none, bf16"),
    # torchrun's environment for rank 0 of 3: 4 rows do not split over 3 ranks
    ([], {"WORLD_SIZE": "3", "RANK": "0"}, "must be divisible by train.grad_accum x world size"),
    (["--dist.strategy", "fsdp", "--writeback.policy", "eco"],
     {"WORLD_SIZE": "2", "RANK": "0"}, "writeback.policy=eco is not supported with"),
])
def test_bad_distributed_settings(argv: list[str], env: dict, match: str, tmp_path: Path,
                                  capsys: pytest.CaptureFixture,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert main(["train", *TINY, "--run.dir", str(tmp_path / "runs"), *argv]) == 2
    assert match in _err(capsys)
    assert not (tmp_path / "runs").exists()


def test_a_shard_that_is_not_fsdps_row_chunk_is_refused_naming_the_tensor() -> None:
    from snip.errors import UserError
    from snip.optim.shard import shard_rows

    w = torch.zeros(5, 3)  # 5 rows over 2 ranks: FSDP gives rank 0 rows 0:3, rank 1 rows 3:5
    assert shard_rows("w", w[:3], 0, 1) == slice(0, 3)
    with pytest.raises(UserError, match=r"cannot place layers.0.w \(global \(5, 3\)\): rank 1 of"
                                        r" 2 holds a shard of \(5, 3\), not rows 3:5"):
        shard_rows("layers.0.w", w, 1, 2)
