"""Fault injection: kills, concurrent writers and failing peers never lose a run (issue 14).

Each test reproduces one way a run directory used to be damaged:

* a failed ``--resume`` rewrote config.toml and truncated metrics.jsonl before failing;
* a SIGKILL while metrics.jsonl was being trimmed on resume left it empty;
* a SIGKILL between the two renames of a re-saved checkpoint hid both copies;
* two writers on one run directory interleaved their logs and checkpoints;
* a full disk while checkpointing traced back;
* under data parallelism, a stopping rank exited while rank 0 was still saving (so the launcher
  killed rank 0 mid-save), and a hung rank blocked the others forever.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pause
import pytest
import torch.multiprocessing as mp

from snip.cli import main
from snip.errors import UserError
from snip.train import checkpoint, from_sources, train
from snip.train.metrics import read_metrics
from snip.train.rundir import RunLock

CLI = "import sys; from snip.cli import main; sys.exit(main(sys.argv[1:]))"


def _argv(settings: dict) -> list[str]:
    return [a for k, v in settings.items() for a in (f"--{k}", str(v))]


def _snapshot(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def test_failed_resume_touches_nothing(tiny: dict, tmp_path: Path,
                                       capsys: pytest.CaptureFixture) -> None:
    train(from_sources(overrides={**tiny, "train.steps": 6}))
    run = Path(tiny["run.dir"]) / "tiny"
    before = _snapshot(run)
    small = tmp_path / "tiny.txt"
    small.write_text("too short for seq_len 32")
    assert main(["train", "--resume", str(run), "--data.path", str(small),
                 "--train.steps", "12"]) == 2
    assert "too few for seq_len=32" in capsys.readouterr().err
    assert _snapshot(run) == before
    assert main(["train", "--resume", str(run), "--train.steps", "8"]) == 0  # still resumable


def test_sigkill_while_trimming_metrics_keeps_the_history(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    lines = [f'{{"event": "train", "step": {i}, "loss": 1.0}}\n' for i in range(1, 9)]
    path.write_text("".join(lines))
    # Die at the first write of the rewrite, as a SIGKILL there would.
    script = textwrap.dedent(f"""
        import os, pathlib
        from snip.train.metrics import truncate_after
        real = pathlib.Path.open
        class Dying:
            def __init__(self, f): self.f = f
            def __enter__(self): return self
            def __exit__(self, *a): self.f.close()
            def write(self, s): os._exit(9)
        def open_(self, mode="r", *a, **k):
            f = real(self, mode, *a, **k)
            return Dying(f) if "w" in mode else f
        pathlib.Path.open = open_
        truncate_after(pathlib.Path({str(path)!r}), 4)
    """)
    assert subprocess.run([sys.executable, "-c", script], timeout=60).returncode == 9
    assert path.read_text() == "".join(lines)  # untouched, not truncated to 0 bytes
    from snip.train.metrics import truncate_after

    truncate_after(path, 4)
    assert [e["step"] for e in read_metrics(path)] == [1, 2, 3, 4]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_sigkill_between_the_renames_of_a_resave_is_recovered(tmp_path: Path) -> None:
    root = tmp_path / "run" / "checkpoints"
    script = textwrap.dedent(f"""
        import os, pathlib, torch
        from snip.train import checkpoint
        root = pathlib.Path({str(root)!r})
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.AdamW(model.parameters())
        meta = checkpoint.Meta(model={{}}, tokenizer="byte", vocab_size=256)
        kw = dict(model=model, optimizer=opt, plan={{}}, config_toml="", meta=meta)
        checkpoint.save(root, 6, **kw)
        real = os.replace
        def replace(src, dst):
            if pathlib.Path(src).name.startswith(".tmp-step"):
                os._exit(9)  # killed after step_6 was moved aside, before the new one landed
            real(src, dst)
        os.replace = replace
        checkpoint.save(root, 6, **kw)
    """)
    assert subprocess.run([sys.executable, "-c", script], timeout=120).returncode == 9
    assert checkpoint.list_checkpoints(root) == []  # both copies are hidden
    found = checkpoint.find(tmp_path / "run")
    assert found == root / "step_000006"
    assert checkpoint.load(found).step == 6


def test_a_second_writer_is_refused_with_the_holders_pid(tiny: dict,
                                                         capsys: pytest.CaptureFixture) -> None:
    run = Path(tiny["run.dir"]) / "tiny"
    proc = subprocess.Popen([sys.executable, "-c", pause.cli(12, 60), "train", *_argv(tiny)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:
            if pause.PAUSED.format(12) in line:
                break
        else:
            raise AssertionError(f"never reached the pause (rc={proc.wait()})")
        before = _snapshot(run)
        assert main(["train", *_argv(tiny)]) == 2  # a fresh run with the same name
        assert f"in use by another snip process (PID {proc.pid})" in capsys.readouterr().err
        assert main(["train", "--resume", str(run)]) == 2  # a concurrent resume
        assert f"PID {proc.pid}" in capsys.readouterr().err
        assert _snapshot(run) == before
    finally:
        proc.kill()
        proc.wait()
    with RunLock(run):  # the kernel released the dead holder's lock
        pass


def test_lock_is_released_when_setup_fails_and_when_the_run_ends(tiny: dict) -> None:
    run = Path(tiny["run.dir"]) / "tiny"
    train(from_sources(overrides={**tiny, "train.steps": 2}))
    with RunLock(run), pytest.raises(UserError, match=f"PID {os.getpid()}"):
        train(from_sources(resume=run, overrides={"train.steps": 4}), resume=run)
    with pytest.raises(UserError, match="already holds checkpoints"):
        train(from_sources(overrides=tiny))
    with RunLock(run):
        pass


WARNING = "snip train: warning:"  # e.g. an adaptive tiny run that never re-plans


def _error_lines(capsys: pytest.CaptureFixture) -> str:
    """stderr without the trainer's warning lines: the error itself must be one line."""
    err = capsys.readouterr().err.strip()
    return "\n".join(x for x in err.splitlines() if not x.startswith(WARNING))


def test_disk_full_while_checkpointing_is_one_line_and_keeps_earlier(
        tiny: dict, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    real = checkpoint.save_model

    def save_model(model: object, filename: str) -> None:
        if "step_000012" in filename:
            raise OSError(errno.ENOSPC, "No space left on device", filename)
        real(model, filename)

    monkeypatch.setattr(checkpoint, "save_model", save_model)
    assert main(["train", *_argv(tiny)]) == 2
    err = _error_lines(capsys)
    assert len(err.splitlines()) == 1 and "no space left on device" in err
    assert "model.safetensors" in err and "bytes" in err
    root = Path(tiny["run.dir"]) / "tiny" / "checkpoints"
    assert [p.name for p in root.iterdir()] == ["step_000006"]
    assert checkpoint.load(root / "step_000006").step == 6


def test_disk_full_while_logging_names_the_file(tiny: dict, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture) -> None:
    from snip.train import metrics

    real = metrics.Path.open

    def full(self: Path, mode: str = "r", *a: object, **k: object) -> object:
        if self.name == "metrics.jsonl" and mode == "a" and self.is_file() \
                and self.stat().st_size > 2000:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, mode, *a, **k)

    monkeypatch.setattr(metrics.Path, "open", full)
    assert main(["train", *_argv(tiny)]) == 2
    err = _error_lines(capsys)
    assert len(err.splitlines()) == 1 and "metrics.jsonl" in err and "no space left" in err


def test_disk_full_writing_config_toml(tiny: dict, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture) -> None:
    real = Path.open

    def open_(self: Path, mode: str = "r", *a: object, **k: object) -> object:
        if self.name.startswith(".config.toml.tmp-") and "w" in mode:  # its atomic temporary
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, mode, *a, **k)

    monkeypatch.setattr(Path, "open", open_)
    assert main(["train", *_argv(tiny)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "config.toml" in err and "no space left" in err
    run = Path(tiny["run.dir"]) / "tiny"
    assert not (run / "config.toml").exists()
    assert not [p.name for p in run.iterdir() if p.name.startswith(".config.toml")]


def test_skips_are_limited(tiny: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    from snip.train import NonFiniteError, loop

    monkeypatch.setattr(loop.math, "isfinite", lambda v: False)  # every step non-finite
    settings = {**tiny, "train.skip_nonfinite": True, "train.max_skips": 3}
    with pytest.raises(NonFiniteError, match="more than train.max_skips=3"):
        train(from_sources(overrides=settings))
    run = Path(tiny["run.dir"]) / "tiny"
    skips = [e for e in read_metrics(run / "metrics.jsonl") if e["event"] == "nonfinite"]
    assert len(skips) == 4
    assert [p.name for p in checkpoint.list_checkpoints(run / "checkpoints")] == ["step_000003"]


# ---------------------------------------------------------------------------------------------
# Two gloo ranks on the CPU.


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, settings: dict, at: int, action: str,
          pause_at: tuple[int, float] | None = None) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if pause_at is not None:
        pause.install(*pause_at)
    from snip.train.metrics import MetricsLog

    real = MetricsLog.log

    def log(self: MetricsLog, event: str, step: int, **values: object) -> None:
        real(self, event, step, **values)
        if rank == 1 and event == "train" and step == at:
            if action == "sigterm":
                os.kill(os.getpid(), signal.SIGTERM)  # what a launcher or scheduler sends
            else:
                os.kill(os.getpid(), signal.SIGSTOP)  # hung: stopped, never answers

    MetricsLog.log = log
    result = train(from_sources(overrides=settings))
    sys.exit(130 if result.interrupted else 0)  # as `snip train` exits


def _spawn(settings: dict, at: int, action: str,
           pause_at: tuple[int, float] | None = None) -> BaseException | None:
    ctx = mp.start_processes(_rank, args=(_port(), settings, at, action, pause_at), nprocs=2,
                             join=False, start_method="spawn")
    deadline = time.monotonic() + 120  # a test that can fail, not hang: kill stuck ranks
    try:
        while not ctx.join(timeout=1, grace_period=2):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                return TimeoutError("the ranks did not finish within 120 s")
    except Exception as e:  # the first failing rank; the others were terminated
        return e
    return None


@pytest.mark.slow
def test_sigterm_on_one_rank_saves_and_all_ranks_exit_together(tiny: dict) -> None:
    # rank 0's save of step 3 is slow
    err = _spawn({**tiny, "precision.preset": "fp32"}, 3, "sigterm", pause_at=(3, 3.0))
    assert isinstance(err, mp.ProcessExitedException) and err.exit_code == 130, err
    root = Path(tiny["run.dir"]) / "tiny" / "checkpoints"
    assert [p.name for p in root.iterdir()] == ["step_000003"]  # complete, no .tmp- left
    assert checkpoint.load(root / "step_000003").step == 3


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_hung_rank_ends_the_run_with_a_clear_error(tiny: dict, strategy: str) -> None:
    """The last complete checkpoint stays intact (under FSDP: a sharded one)."""
    settings = {**tiny, "precision.mode": "fixed", "precision.preset": "fp32",
                "train.ckpt_every": 2, "dist.timeout": 3, "dist.strategy": strategy}
    t0 = time.monotonic()
    err = _spawn(settings, 3, "hang")
    assert isinstance(err, mp.ProcessRaisedException), err
    assert "another rank is hung or died" in str(err) and "PeerError" in str(err)
    assert time.monotonic() - t0 < 60
    root = Path(tiny["run.dir"]) / "tiny" / "checkpoints"
    last = checkpoint.load(checkpoint.list_checkpoints(root)[-1])
    assert last.step == 2 and last.sharded == (strategy == "fsdp")


def test_sigterm_saves_and_stops_like_ctrl_c(tiny: dict,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from snip.train.metrics import MetricsLog

    real = MetricsLog.log

    def log(self: MetricsLog, event: str, step: int, **values: object) -> None:
        real(self, event, step, **values)
        if event == "train" and step == 4:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(MetricsLog, "log", log)
    result = train(from_sources(overrides=tiny))
    assert result.interrupted and result.step == 4
    root = Path(tiny["run.dir"]) / "tiny" / "checkpoints"
    assert checkpoint.load(checkpoint.list_checkpoints(root)[-1]).step == 4


def test_a_forwarded_duplicate_signal_still_saves(tiny: dict,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun forwards the terminal's Ctrl-C to workers that already got it: two SIGINTs
    within milliseconds are one stop request, not "interrupt at once"."""
    from snip.train.metrics import MetricsLog

    real = MetricsLog.log

    def log(self: MetricsLog, event: str, step: int, **values: object) -> None:
        real(self, event, step, **values)
        if event == "train" and step == 4:
            os.kill(os.getpid(), signal.SIGINT)  # the terminal's
            os.kill(os.getpid(), signal.SIGINT)  # torchrun's echo

    monkeypatch.setattr(MetricsLog, "log", log)
    result = train(from_sources(overrides=tiny))
    assert result.interrupted and result.step == 4
    root = Path(tiny["run.dir"]) / "tiny" / "checkpoints"
    assert checkpoint.load(checkpoint.list_checkpoints(root)[-1]).step == 4
