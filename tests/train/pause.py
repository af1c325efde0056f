"""Test helper: pause inside the write of one checkpoint, so a test can kill the process or
start a second writer while the checkpoint is half written.

``install(step, seconds)`` wraps ``safetensors.torch.save_file`` (which both checkpoint layouts
call for ``model.safetensors``, the first file of a checkpoint): after writing the weights of
checkpoint ``step`` into its hidden ``.tmp-`` directory it prints ``PAUSED.format(step)`` and
sleeps.  The production save path carries no hook; ``cli(step, seconds)`` is the ``python -c``
program of a ``snip`` command with the pause installed, for subprocess tests.
"""

from __future__ import annotations

import time
from pathlib import Path

PAUSED = "pausing inside checkpoint write of step {}"


def install(step: int, seconds: float) -> None:
    import safetensors.torch as st

    real = st.save_file

    def save_file(tensors, filename, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        real(tensors, filename, *args, **kwargs)
        if Path(filename).parent.name.startswith(f".tmp-step_{step:06d}-"):
            print(PAUSED.format(step), flush=True)
            time.sleep(seconds)

    st.save_file = save_file


def cli(step: int, seconds: float) -> str:
    here = str(Path(__file__).parent)
    return (f"import sys; sys.path.insert(0, {here!r}); import pause; "
            f"pause.install({step}, {seconds}); from snip.cli import main; "
            f"sys.exit(main(sys.argv[1:]))")
