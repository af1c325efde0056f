"""``snip sample``: generate text from a checkpoint, in its plan or any other precision.

    snip sample runs/NAME --prompt "def main(" --tokens 200
    snip sample runs/NAME --temperature 0 --precision.preset nvfp4   # greedy, in NVFP4

The text is printed as it is generated.
"""

from __future__ import annotations

import argparse
from pathlib import Path

COMMAND = "sample"
HELP = "generate text from a checkpoint (with its plan or another precision)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from snip.cli.eval import PRECISION_KEYS, PRECISION_OF_RUN
    from snip.cli.train import add_config_options, add_run_argument

    add_run_argument(parser)
    parser.add_argument("--prompt", default="\n", help="text to continue")
    parser.add_argument("--tokens", type=int, default=200, help="tokens to generate")
    parser.add_argument("--temperature", type=float, default=0.8,
                        help="sampling temperature (0: greedy)")
    parser.add_argument("--top-k", type=int, default=0, help="sample among the k most likely "
                                                            "tokens only (0: all)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    add_config_options(parser, keys=PRECISION_KEYS,  # not the adaptive-training options
                       of_run=PRECISION_OF_RUN)


def run(args: argparse.Namespace) -> int:
    from snip.cli.train import config_overrides
    from snip.errors import UserError
    from snip.train.config import INT_LIMIT
    from snip.train.inference import load

    if not -INT_LIMIT <= args.seed < INT_LIMIT:  # every integer option's bound (int64)
        raise UserError(f"--seed {args.seed} is out of range (|x| < 2**63)")
    if args.tokens < 1 or not args.temperature >= 0 or args.top_k < 0:  # (NaN too)
        raise UserError(f"--tokens ({args.tokens}) must be >= 1, --temperature "
                        f"({args.temperature}) and --top-k ({args.top_k}) >= 0")
    loaded = load(Path(args.run), config_overrides(args), need_data=False)  # corpus optional
    print(args.prompt, end="", flush=True)
    shown: list[str] = []

    def stream(piece: str) -> None:  # the text as it is generated (a large model is slow)
        shown.append(piece)
        print(piece, end="", flush=True)

    try:
        text = loaded.sample(args.prompt, tokens=args.tokens, temperature=args.temperature,
                             top_k=args.top_k, seed=args.seed, on_text=stream)
    except KeyboardInterrupt:
        print()  # end the text's line: "interrupted" follows on a line of its own
        raise
    done = "".join(shown)
    # the rest (a last incomplete character) and a newline; all of it again on a line of its own
    # if a tokenizer's decoding changed text already shown (a cleanup of spaces, say)
    print(text[len(done):] if text.startswith(done) else "\n" + args.prompt + text)
    return 0
