"""How far apart do two honest runs of the same quantized training drift? (issue 20)

A quantized trajectory is not "equal to float tolerance" across machines: a different
reduction order changes the last bit of a value, a last-bit change can flip one FP4 rounding,
and the flip is a real step in the trajectory.  The tests in ``tests/train/test_distributed*.py``
therefore assert bitwise equality where the two computations do the same operations in the same
order, and a *measured* bound elsewhere.  This script measures that bound.

It trains the test suite's tiny run (``tests/conftest.py``'s ``tiny`` settings, 4 steps, the
same presets as the parity tests) under every variation a user's machine may bring:

* ``--train.threads`` 1 and 2 (another intra-op split of every GEMM and reduction),
* ``ATEN_CPU_CAPABILITY`` default and ``avx2`` (other vector kernels for the elementwise ops),
* ``SNIP_FAST=0`` (the pure-PyTorch quantizers instead of the numba kernels),
* two ranks (DDP and FSDP2 over gloo) and one process with ``grad_accum`` 2,

each in a fresh process, and reports per preset the largest relative loss difference and the
largest absolute final-weight difference of every variant to the default one-process run.
Variants that do the same operations in the same order must be bitwise equal (and are asserted so
by the tests); the others give the spread the tests' bounds are derived from.

Usage::

    python benchmarks/parity_spread.py             # ~3 minutes on 2 cores
    python benchmarks/parity_spread.py --steps 40  # the long-trajectory spread

Writes ``benchmarks/out/parity_spread.json`` (CPU model and flags included).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks._util import cpu_info, write_json  # noqa: E402

PRESETS = ("fp32", "mxfp4", "fp8_e4m3", "nvfp4")
# (name, environment, extra overrides, ranks)
VARIANTS: tuple[tuple[str, dict[str, str], dict[str, object], int], ...] = (
    ("default", {}, {}, 1),
    ("threads2", {}, {"train.threads": 2}, 1),
    ("avx2", {"ATEN_CPU_CAPABILITY": "avx2"}, {}, 1),
    ("torch_path", {"SNIP_FAST": "0"}, {}, 1),
    ("accum2", {}, {"train.grad_accum": 2}, 1),
    ("ddp2", {}, {"dist.strategy": "ddp"}, 2),
    ("fsdp2", {}, {"dist.strategy": "fsdp"}, 2),
)


def settings(corpus: Path, runs: Path, preset: str, steps: int) -> dict[str, object]:
    return {"model.name": "tiny", "data.path": str(corpus), "train.steps": steps,
            "train.batch_size": 4, "train.seq_len": 32, "train.warmup_steps": 2,
            "train.eval_every": steps, "train.eval_batches": 2, "train.ckpt_every": steps,
            "train.threads": 1, "log.every": 1, "log.progress": False,
            "precision.mode": "fixed", "precision.preset": preset,
            "run.dir": str(runs), "run.name": "run"}


def _worker(rank: int, world: int, port: int, overrides: dict) -> None:
    from snip.train import from_sources, train

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    train(from_sources(overrides=overrides))


def child(overrides: dict, ranks: int, out: Path) -> None:
    """Train once (in this fresh process) and write its losses and final weights to ``out``."""
    import socket

    import torch.multiprocessing as mp
    from safetensors.torch import load_file, save_file

    from snip.train import checkpoint, from_sources, train
    from snip.train.metrics import read_metrics

    if ranks == 1:
        train(from_sources(overrides=overrides))
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(_worker, args=(ranks, port, overrides), nprocs=ranks, join=True)
    run = Path(overrides["run.dir"]) / "run"
    losses = [e["loss"] for e in read_metrics(run / "metrics.jsonl") if e["event"] == "train"]
    last = checkpoint.list_checkpoints(run / "checkpoints")[-1]
    save_file(load_file(str(last / "model.safetensors")), str(out.with_suffix(".safetensors")))
    out.write_text(json.dumps(losses))


def run_variant(corpus: Path, preset: str, steps: int, variant: tuple, scratch: Path):
    import torch
    from safetensors.torch import load_file

    name, env, extra, ranks = variant
    runs = scratch / f"{preset}_{name}"
    overrides = {**settings(corpus, runs, preset, steps), **extra}
    out = scratch / f"{preset}_{name}.json"
    cmd = [sys.executable, __file__, "--child", json.dumps(overrides), str(ranks), str(out)]
    subprocess.run(cmd, check=True, env={**os.environ, **env},
                   stdout=subprocess.DEVNULL)
    weights = load_file(str(out.with_suffix(".safetensors")))
    return json.loads(out.read_text()), {k: v.to(torch.float64) for k, v in weights.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(json.loads(args.child[0]), int(args.child[1]), Path(args.child[2]))
        return
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    result: dict[str, object] = {"cpu": cpu_info(), "steps": args.steps, "presets": {}}
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        corpus = scratch / "corpus.txt"  # the test suite's corpus (tests/conftest.py)
        corpus.write_text("".join((stdlib / f).read_text()
                                  for f in ("argparse.py", "textwrap.py")))
        for preset in args.presets.split(","):
            got = {v[0]: run_variant(corpus, preset, args.steps, v, scratch) for v in VARIANTS}
            rows = {}
            # every variant against the default one-process run, and the two-rank runs also
            # against one process with two micro-batches (what they compute, in the same order)
            pairs = [(v[0], "default") for v in VARIANTS[1:]]
            pairs += [("ddp2", "accum2"), ("fsdp2", "accum2")]
            for name, ref in pairs:
                (loss, w), (ref_loss, ref_w) = got[name], got[ref]
                rel = [abs(a - b) / abs(b) for a, b in zip(loss, ref_loss, strict=True)]
                wdiff = max((w[k] - ref_w[k]).abs().max().item() for k in ref_w)
                key = name if ref == "default" else f"{name}_vs_{ref}"
                rows[key] = {"loss_rel_max": max(rel), "loss_rel_first": rel[0],
                             "weight_abs_max": wdiff, "bitwise": max(rel) == 0 and wdiff == 0}
                print(f"{preset:9s} {key:16s} loss rel max {max(rel):.2e} "
                      f"(step 1 {rel[0]:.2e})  weight abs max {wdiff:.2e}", flush=True)
            result["presets"][preset] = rows
    path = write_json("parity_spread.json" if args.steps == 4
                      else f"parity_spread_{args.steps}.json", result)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
