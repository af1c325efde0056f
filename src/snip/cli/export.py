"""``snip export``: a trained checkpoint as a Hugging Face model directory.

    snip export runs/NAME --format hf --out hf_model/        # newest checkpoint of the run
    snip export runs/NAME/checkpoints/step_000500 --format hf --out hf_model/

The checkpoint's model shape (``meta.json`` -> ``model``) becomes a ``LlamaConfig`` and its
weights a ``LlamaForCausalLM`` (``config.json`` + ``model.safetensors``), loadable with
``transformers.AutoModelForCausalLM.from_pretrained(out)`` and computing the same logits (see
:func:`snip.models.hf.to_hf_llama`).  The weights are the fp32 masters: a low-precision plan is
a property of training, not of the exported model.  ``snip_export.json`` records where it came
from (checkpoint, step, plan, tokenizer).  The checkpoint's tokenizer (byte or BPE) is written
as ``transformers`` expects it (``tokenizer.json`` + ``tokenizer_config.json``), so
``AutoTokenizer.from_pretrained(out)`` and ``pipeline("text-generation", out)`` work
(`snip.data.tokenizer.save_hf_tokenizer`).  Needs ``pip install transformers``; without it the
command says so in one line.

The directory is written whole or not at all (`snip.atomic.output_dir`: a hidden temporary
beside ``--out``, renamed into place; a temporary left by a killed export is removed by the next
one), and ``--out`` is refused when it is, contains or lies inside a run or checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from snip import atomic
from snip.errors import UserError

COMMAND = "export"
HELP = "export a run's checkpoint as a Hugging Face Llama model directory"
FORMATS = ("hf",)
EXPORT_FILE = "snip_export.json"
_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from snip.cli.train import add_run_argument

    add_run_argument(parser)
    parser.add_argument("--format", choices=FORMATS, default="hf",
                        help="output format: hf = transformers LlamaForCausalLM directory")
    parser.add_argument("--out", metavar="DIR", required=True, help="output directory")


def export_hf(run: str | Path, out: str | Path) -> Path:
    """Export the checkpoint ``run`` (a run or checkpoint directory) to ``out``; returns it."""
    import torch
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_model

    from snip.data.tokenizer import save_hf_tokenizer
    from snip.models import ModelConfig, build_model
    from snip.models.hf import _transformers, save_hf_llama
    from snip.train import checkpoint

    _transformers()  # absent: one line naming what to install, before any work
    path = checkpoint.find(Path(run), "RUN")
    out = Path(out)
    check_out(out, path)
    recorded = checkpoint.verify(path)
    meta = checkpoint.Meta.from_dict(recorded)
    if not meta.model:
        raise UserError(f"checkpoint {path} records no model shape (meta.json has no 'model')")
    cfg = ModelConfig(**meta.model)
    weights = path / "model.safetensors"
    with safe_open(str(weights), "pt") as f:  # the stored dtype (tied tensors are stored once)
        dtype = f.get_slice(next(iter(f.keys()))).get_dtype()
    model = build_model(cfg, dtype=getattr(torch, _DTYPES.get(dtype, "float32")))
    missing, unexpected = load_model(model, str(weights), strict=False)
    if missing or unexpected:
        raise UserError(f"checkpoint {path} does not fit its recorded model shape (missing "
                         f"{sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")
    tokenizer = meta.tokenizer or None
    tok = checkpoint.tokenizer_of(path)  # None: pre-tokenized data, no text tokenizer
    plan = path / "plan.json"
    source = {"checkpoint": str(path), "step": recorded.get("step"), "tokenizer": tokenizer,
              "plan": json.loads(plan.read_text()) if plan.is_file() else None}
    try:
        with atomic.output_dir(out) as tmp:  # all or nothing: renamed into place when complete
            save_hf_llama(model, tmp)
            if tok is not None:
                save_hf_tokenizer(tok, tmp, cfg.max_seq_len)
            (tmp / EXPORT_FILE).write_text(json.dumps(source, indent=2) + "\n")
    except SafetensorError as e:  # safetensors reports a full disk as its own error
        raise UserError(f"cannot write {out}: {str(e).strip().splitlines()[0][:200]}") from None
    return out


def check_out(out: Path, source: Path) -> None:
    """``--out`` must not be, contain or lie inside the checkpoint or its run directory (the
    export would overwrite its own source), nor be a file or a directory of other files."""
    run = source.parent.parent if source.parent.name == "checkpoints" else None
    target = Path(os.path.realpath(out))
    for protected in (source, run):
        if protected is None:
            continue
        p = Path(os.path.realpath(protected))
        if target == p or p in target.parents or target in p.parents:
            what = "checkpoint" if protected == source else "run directory"
            raise UserError(f"--out {out} would overwrite the {what} {protected} it exports; "
                            "choose an --out outside it")
    atomic.check_outside(out, "--out")  # inside some other run, checkpoint or sweep
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a directory to write the model into")
    if out.is_dir() and any(out.iterdir()) and not (out / EXPORT_FILE).is_file():
        raise UserError(f"--out {out} is a directory holding other files (not an earlier "
                        "export); choose a new or empty directory")


def run(args: argparse.Namespace) -> int:
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    if not sys.stderr.isatty():  # transformers' "Writing model shards" bar: a terminal's only
        hf_logging.disable_progress_bar()
    try:
        out = export_hf(args.run, args.out)
    finally:
        if shown:
            hf_logging.enable_progress_bar()
    print(f"exported {args.run} -> {out} (transformers LlamaForCausalLM)")
    return 0
