"""``snip train``: train a model with per-GEMM precision and write a run directory.

    snip train                                   # small model, embedded corpus, ~5 min on a CPU
    snip train --model.name tiny --train.steps 200 --precision.preset mxfp4
    snip train --config my_run.toml --train.steps 2000   # a TOML file of the same keys
    snip train --resume runs/NAME                # continue exactly where it stopped
    snip train --init-from runs/A/checkpoints/step_000400 --run.name B --precision.preset mxfp4
                                                 # branch: a new run from A's step 400 state
    snip train --init-from-hf hf/llama_dir --precision.mode adaptive
                                                 # continue pretraining a Hugging Face
                                                 # Llama/Mistral (snip.integrations.pretrained)
    torchrun --nproc_per_node 2 $(which snip) train --train.batch_size 32

Every option of the run configuration (`snip.train.config`) is a ``--section.key`` flag,
generated from the dataclass fields with their help and defaults; a ``--config`` TOML file sets
the same keys and the flags win. The run ends with ``snip report`` on its directory.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping

from snip import atomic
from snip.errors import UserError

COMMAND = "train"
HELP = "train a model (default: small model on the embedded corpus) and write runs/NAME"
_PREFIX = "cfg:"  # namespace attributes that are config keys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML config file (flags override it)")
    parser.add_argument("--resume", metavar="RUN_DIR",
                        help="continue runs/NAME from its newest checkpoint, or from the given "
                             "checkpoint directory (only train.steps, eval/checkpoint cadence, "
                             "threads, device and log settings may change)")
    parser.add_argument("--init-from", metavar="CHECKPOINT",
                        help="branch a new run (its own run.name and settings, defaults: the "
                             "parent's) from a checkpoint's weights, optimizer state and step")
    parser.add_argument("--init-from-hf", metavar="HF_DIR",
                        help="start a new run from the weights of a Hugging Face Llama/Mistral "
                             "model directory (save_pretrained output); the model is its shape")
    add_config_options(parser)


def add_config_options(parser: argparse.ArgumentParser, sections: tuple[str, ...] = (),
                       keys: tuple[str, ...] = (),
                       of_run: Mapping[str, str] | None = None) -> None:
    """A ``--section.key`` flag for every config option (only those of ``sections``, or only
    the dotted ``keys``, if given), with its help, its default and, for an enumerated value,
    its choices; grouped by section in ``--help``. `config_overrides` reads them back.

    ``of_run``: the options change a trained run's settings (``snip eval``, ``snip sample``),
    so each one's default is the run's; the mapping gives a key its help for that use."""
    from snip.train.config import NAMES, leaves, plain

    groups: dict[str, argparse._ArgumentGroup] = {}
    for leaf in leaves():
        section = leaf.key.split(".")[0]
        if (sections and section not in sections) or (keys and leaf.key not in keys):
            continue
        group = section if "." in leaf.key else "general"  # top-level keys such as seed
        if group not in groups:
            groups[group] = parser.add_argument_group(f"{group} options")
        kind = "BOOL" if leaf.type is bool else "NAME" if leaf.type == NAMES \
            else leaf.type.__name__.upper()
        choices = leaf.choices
        if choices:
            kind = "{" + ",".join(choices) + "}"
        value = plain(leaf.default)
        default = (repr(value) if leaf.type is str else str(value).lower() if leaf.type is bool
                   else repr(",".join(value)) if leaf.type == NAMES else str(value))
        text = leaf.help
        if of_run is not None:  # (no re-plans outside training)
            text = of_run.get(leaf.key, text).replace("; kept across re-plans", "")
            default = "the run's"
        groups[group].add_argument(
            f"--{leaf.key}", dest=f"{_PREFIX}{leaf.key}", default=argparse.SUPPRESS,
            metavar=kind,  # a list: NAME NAME or NAME,NAME
            nargs="?" if leaf.type is bool else "+" if leaf.type == NAMES else None,
            const="true" if leaf.type is bool else None,
            help=f"{text} (default: {default})".replace("%", "%%"))


def add_run_argument(parser: argparse.ArgumentParser) -> None:
    """The ``RUN`` positional of the commands that read a trained checkpoint."""
    parser.add_argument("run", metavar="RUN",
                        help="run directory (its newest checkpoint) or a checkpoint directory")


def config_overrides(args: argparse.Namespace) -> dict[str, object]:
    """The config options given on the command line, as dotted keys."""
    return {k[len(_PREFIX):]: v for k, v in vars(args).items() if k.startswith(_PREFIX)}


def run(args: argparse.Namespace) -> int:
    from snip.train import NonFiniteError, from_sources, train

    overrides, hooks = config_overrides(args), []
    if getattr(args, "init_from_hf", None):
        if args.resume or args.init_from:
            raise UserError("--init-from-hf starts a new run: drop --resume/--init-from")
        from snip.integrations.pretrained import init_from_hf

        overrides, hook = init_from_hf(args.init_from_hf, overrides)
        hooks.append(hook)
    cfg = from_sources(args.config, overrides, args.resume, args.init_from)
    if not args.resume:  # a new run's directory: never inside another run, checkpoint or sweep
        atomic.check_outside(cfg.run.dir, "--run.dir")
    try:
        result = train(cfg, resume=args.resume, init_from=args.init_from, hooks=hooks)
    except NonFiniteError as e:
        print(f"snip train: {e}", file=sys.stderr)
        _report(cfg)
        return 3
    report = _report(cfg)
    if result.interrupted:
        print(f"snip train: interrupted at step {result.step}; checkpoint saved. Continue with: "
              f"snip train --resume {result.run_dir}", file=sys.stderr)
        return 130
    if report is not None:
        print(f"run: {result.run_dir}  step {result.step}  train loss {result.train_loss:.4f}  "
              f"val loss {result.val_loss:.4f}  ({result.seconds:.0f}s)")
        print(f"report: {report}")
    return 0


def _report(cfg: object) -> object:
    """Write the run's report from rank 0; returns its path (None on other ranks)."""
    import os
    from pathlib import Path

    if int(os.environ.get("RANK", "0")) != 0:
        return None
    from snip.report import write_report

    run_dir = Path(cfg.run.dir) / cfg.run.name
    return write_report([run_dir], out=run_dir)
