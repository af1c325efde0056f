"""A SIGKILL in the middle of a checkpoint write never destroys the last good checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pause

from snip.train import checkpoint, from_sources, train


def test_sigkill_during_checkpoint_write(tiny: dict) -> None:
    argv = [a for k, v in {**tiny, "train.ckpt_every": 4}.items() for a in (f"--{k}", str(v))]
    proc = subprocess.Popen([sys.executable, "-c", pause.cli(8, 120), "train", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:
            if pause.PAUSED.format(8) in line:
                break
        else:
            raise AssertionError(f"never reached the pause (rc={proc.wait()})")
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()

    run = Path(tiny["run.dir"]) / "tiny"
    root = run / "checkpoints"
    assert [p.name for p in checkpoint.list_checkpoints(root)] == ["step_000004"]
    assert any(p.name.startswith(".tmp-step_000008") for p in root.iterdir())  # the torn one
    assert checkpoint.load(root / "step_000004").step == 4
    result = train(from_sources(resume=run), resume=run)  # resumes from the good one
    assert result.step == 12
    assert not any(p.name.startswith(".tmp-") for p in root.iterdir())
