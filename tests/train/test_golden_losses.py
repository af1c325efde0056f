"""Golden losses: a short `snip.train` run of the tiny model per main preset against a file.

Any change of numerics (a rounding, a scale, a kernel, the order of the data) shows here as a
diff of ``tests/assets/golden_losses.json``, the per-step training losses of 8 steps of the tiny
model on a fixed corpus (``tests/assets/golden_corpus.txt``, so no interpreter's standard library
decides it).  Bit for bit is a property of a machine kind, not of the code: oneDNN and MKL choose
other GEMM kernels on other CPUs, and a last-bit change can flip an FP4 rounding (issue 20).  So
the file holds one entry per *kernel identity* (torch version, ATen's vector ISA, CPU vendor and
the ISA flags that select kernels):

* on a machine kind the file has, every loss must equal the recorded one bit for bit;
* on another, every loss must stay within the measured spread of honest variants
  (``parity.LOSS_REL``) of the first entry, and the test says which entry it compared with.

Record the entry of a new machine kind (or a deliberate change of numerics, explained in its
commit) with ``PYTHONPATH=src python tests/train/test_golden_losses.py --record``.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pytest
import torch

ASSETS = Path(__file__).resolve().parents[1] / "assets"
GOLDEN = ASSETS / "golden_losses.json"
CORPUS = ASSETS / "golden_corpus.txt"
PRESETS = ("bf16", "fp8_e4m3", "fp8_e4m3_tile128", "mxfp8_e4m3", "mxfp4", "nvfp4",
           "fp4_e2m1_tile128", "fp4_e2m1_tensor")
STEPS = 8
KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16",
                "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")


def kernel_identity() -> str:
    """What decides which CPU kernels torch runs: its version, the vector ISA ATen dispatches to
    (``ATEN_CPU_CAPABILITY`` can lower it), the CPU vendor and its ISA flags (oneDNN, MKL)."""
    vendor, flags = "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "vendor_id":
                vendor = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    aten = torch.backends.cpu.get_cpu_capability()
    return f"torch {torch.__version__} | aten {aten} | {vendor} | " + " ".join(
        f for f in KERNEL_FLAGS if f in flags)


def train_losses(preset: str, root: Path) -> list[float]:
    from snip.train import from_sources, train
    from snip.train.metrics import read_metrics

    overrides = {"model.name": "tiny", "data.path": str(CORPUS), "train.steps": STEPS,
                 "train.batch_size": 4, "train.seq_len": 32, "train.warmup_steps": 2,
                 "train.eval_every": STEPS, "train.eval_batches": 1, "train.ckpt_every": STEPS,
                 "train.threads": 1, "log.every": 1, "log.progress": False,
                 "precision.mode": "fixed", "precision.preset": preset,
                 "run.dir": str(root), "run.name": preset}
    train(from_sources(overrides=overrides))
    events = read_metrics(root / preset / "metrics.jsonl")
    return [e["loss"] for e in events if e["event"] == "train"]


def _entries() -> dict[str, dict[str, list[float]]]:
    return json.loads(GOLDEN.read_text())["entries"]


@pytest.mark.parametrize("preset", PRESETS)
def test_losses_equal_the_golden_file(preset: str, tmp_path: Path) -> None:
    from parity import LOSS_REL

    entries = _entries()
    got = train_losses(preset, tmp_path)
    assert len(got) == STEPS
    here = kernel_identity()
    if here in entries:
        assert got == entries[here][preset], (here, preset)  # bit for bit on this machine kind
    else:  # another CPU: within the spread of honest variants (see the module docstring)
        name, first = next(iter(entries.items()))
        assert got == pytest.approx(first[preset], rel=LOSS_REL), (name, preset)


def record() -> None:
    """Add (or replace) this machine kind's entry in the golden file."""
    data = json.loads(GOLDEN.read_text()) if GOLDEN.is_file() else {
        "what": __doc__.split("\n")[0], "steps": STEPS, "entries": {}}
    with tempfile.TemporaryDirectory() as tmp:
        data["entries"][kernel_identity()] = {p: train_losses(p, Path(tmp)) for p in PRESETS}
    GOLDEN.write_text(json.dumps(data, indent=1) + "\n")
    print(f"recorded {kernel_identity()} in {GOLDEN}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit("usage: PYTHONPATH=src python tests/train/test_golden_losses.py --record")
    record()
