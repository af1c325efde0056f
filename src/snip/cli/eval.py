"""``snip eval``: validation loss and perplexity of a checkpoint, with its plan and in fp32.

    snip eval runs/NAME                                   # its newest checkpoint, its data
    snip eval runs/NAME/checkpoints/step_000400 --data.path other.txt --train.eval_batches 64
    snip eval runs/NAME --precision.preset mxfp4          # the same weights, run in MXFP4

Prints one line per loss and writes nothing (``--json FILE`` saves the numbers, outside any
run, checkpoint or sweep: :func:`snip.atomic.check_outside`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

COMMAND = "eval"
HELP = "validation loss/perplexity of a checkpoint, quantized (its plan) and in high precision"
PRECISION_KEYS = ("precision.preset", "precision.plan", "precision.gemm", "precision.accum")
# what the precision options do to a trained run's checkpoint (``snip eval``, ``snip sample``)
PRECISION_OF_RUN = {
    "precision.preset": "run every GEMM in this preset instead of the run's plan",
    "precision.plan": "run with this precision plan JSON file instead of the run's plan"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from snip.cli.train import add_config_options, add_run_argument

    add_run_argument(parser)
    parser.add_argument("--json", metavar="FILE", help="also write the numbers as JSON")
    # the data to evaluate on, and the precision to run in; not the adaptive-training options
    add_config_options(parser, ("data",), of_run={})
    add_config_options(parser, keys=PRECISION_KEYS, of_run=PRECISION_OF_RUN)
    parser.add_argument("--train.eval_batches", dest="cfg:train.eval_batches",
                        default=argparse.SUPPRESS, metavar="INT",
                        help="validation batches spread over the split (default: the run's)")
    parser.add_argument("--train.device", dest="cfg:train.device", default=argparse.SUPPRESS,
                        metavar="STR", help="cpu, mps, cuda, cuda:N or auto (default: the run's)")


def run(args: argparse.Namespace) -> int:
    from snip import atomic
    from snip.cli.train import config_overrides
    from snip.errors import UserError
    from snip.train.inference import load

    if args.json:  # before the evaluation, not after it
        out = Path(args.json)
        why = ("is a directory; name a file" if out.is_dir() else
               "its directory does not exist" if not out.parent.is_dir() else
               "its directory is not writable" if not os.access(out.parent, os.W_OK) else "")
        if why:
            raise UserError(f"--json {args.json}: {why}")
        atomic.check_outside(out, "--json")  # (runs/X/metrics.jsonl replaced the run's metrics)
    loaded = load(Path(args.run), config_overrides(args))
    r = loaded.evaluate(bar=True)
    precision = loaded.precision
    windows = loaded.cfg.train.eval_batches
    print(f"{loaded.path} (step {loaded.step}), {windows} strided validation batches of "
          f"{loaded.cfg.data.path or 'the embedded corpus'}:")
    print(f"  quantized ({precision}): loss {r.loss:.4f}  ppl {r.ppl:.3f}")
    print(f"  high precision (fp32):   loss {r.loss_hp:.4f}  "
          f"ppl {math.exp(min(r.loss_hp, 50)):.3f}")
    if args.json:
        atomic.write_text(args.json, json.dumps({
            "checkpoint": str(loaded.path), "step": loaded.step, "val_loss": r.loss,
            "val_loss_hp": r.loss_hp, "ppl": r.ppl, "eval_batches": windows,
            "data": loaded.cfg.data.path, "precision": precision}, indent=1) + "\n")
    return 0
