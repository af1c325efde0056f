"""Shared fixtures: a small text corpus and the settings of a seconds-long tiny run."""

from __future__ import annotations

import contextlib
import os
import signal
import sysconfig
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# Inductor's on-disk cache does not keep apart the kernels it builds under different
# ATEN_CPU_CAPABILITY settings: a run pinned to avx2 after an unpinned one (`make test` does
# that) loads the other's kernels and computes wrong values, and the next unpinned run can
# corrupt its heap (RESULTS §7e). So the tests keep one cache per setting (set before torch
# is imported: Inductor fixes the variable the first time it looks).
_CAPABILITY = os.environ.get("ATEN_CPU_CAPABILITY") or "native"
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(
    tempfile.gettempdir(), f"torchinductor_snip_{_CAPABILITY}"))

from snip.train.metrics import MetricsLog  # noqa: E402 (imports torch: after the cache directory)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~150 kB of Python source as one text file: small enough to tokenize instantly."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = "".join((stdlib / f).read_text() for f in ("argparse.py", "textwrap.py"))
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text(text)
    return path


@pytest.fixture
def tiny(corpus: Path, tmp_path: Path) -> dict[str, object]:
    """Dotted overrides for a tiny run in tmp_path/runs/tiny (12 steps, a second or two)."""
    return {
        "model.name": "tiny", "data.path": str(corpus), "train.steps": 12,
        "train.batch_size": 4, "train.seq_len": 32, "train.warmup_steps": 2,
        "train.eval_every": 6, "train.eval_batches": 2, "train.ckpt_every": 6,
        "train.threads": 1, "log.every": 1, "log.progress": False,
        "run.dir": str(tmp_path / "runs"), "run.name": "tiny",
    }


@contextlib.contextmanager
def _ctrl_c_after(step: int) -> Iterator[None]:
    real_log = MetricsLog.log

    def log_then_interrupt(self: MetricsLog, event: str, at: int, **values: object) -> None:
        real_log(self, event, at, **values)
        if event == "train" and at == step:
            os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C does

    MetricsLog.log = log_then_interrupt
    try:
        yield
    finally:
        MetricsLog.log = real_log


@pytest.fixture
def ctrl_c_after() -> Callable[[int], contextlib.AbstractContextManager[None]]:
    """``with ctrl_c_after(5): train(...)`` sends SIGINT right after step 5 is logged."""
    return _ctrl_c_after
