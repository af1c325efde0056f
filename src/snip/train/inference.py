"""A trained model back from a checkpoint, for evaluation and generation (`snip eval`, `sample`).

    loaded = load(Path("runs/NAME"), {"precision.preset": "mxfp4"})
    loaded.evaluate(batches=32)          # EvalResult: loss with the plan, and high precision
    loaded.sample("def ", tokens=64)     # text

The run's own settings come from the checkpoint's ``config.toml``; ``overrides`` may point the
evaluation at another corpus (``data.path``; it must use the run's tokenizer) or run it in
another precision (``precision.preset`` or ``precision.plan``; otherwise the checkpoint's plan).
Nothing is written.

The checkpoint carries its tokenizer (`snip.train.checkpoint.tokenizer_of`): when the run's
tokenizer file is gone, that copy is used; and generation (``need_data=False``, what ``snip
sample`` asks for) works even when the training corpus is gone too.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from torch import nn
from tqdm import tqdm

from snip.errors import MissingFileError, UserError
from snip.models import build_model
from snip.nn import convert
from snip.plan import PrecisionPlan
from snip.train import checkpoint
from snip.train import config as C
from snip.train.batches import Batch, Batches, open_data
from snip.train.evaluation import EvalResult, autocast, evaluate, passes
from snip.train.loop import model_config, order_seed, pick_device
from snip.train.precision import initial_plan
from snip.train.resume import check_compatible


@dataclass
class Loaded:
    """A checkpoint's model in its plan (or the one asked for), with the run's data."""

    cfg: C.Config
    model: nn.Module
    data: Batches  # dataset None when loaded without data (need_data=False, corpus gone)
    plan: PrecisionPlan
    step: int
    path: Path
    device: torch.device
    precision: str  # "its plan", or the preset / plan file asked for

    def evaluate(self, batches: int | None = None, bar: bool = False) -> EvalResult:
        """Both validation losses on ``batches`` strided windows (default: the run's); ``bar``:
        a progress bar of the forward passes on a terminal (stderr)."""
        t = self.cfg.train
        windows = _Windows(self.data, t.batch_size // t.grad_accum, t.seq_len,
                           batches or t.eval_batches)
        total = len(windows) * passes(self.model, t.bf16)
        with tqdm(total=total, unit="batch", desc="evaluating", leave=False,
                  disable=not (bar and sys.stderr.isatty())) as shown:
            return evaluate(self.model, windows, self.device, self.step, t.bf16,
                            done=shown.update)

    @torch.no_grad()
    def sample(self, prompt: str, tokens: int = 200, temperature: float = 0.8, top_k: int = 0,
               seed: int = 0, on_text: Callable[[str], None] | None = None) -> str:
        """Continue ``prompt`` by ``tokens`` tokens (temperature 0: greedy).  ``on_text`` is
        given the text as it grows, piece by piece, each piece once it decodes to whole
        characters (a byte of a longer UTF-8 character waits for the rest) and only while the
        pieces, joined, begin the decoded text."""
        tok = (self.data.dataset.tokenizer if self.data.dataset is not None
               else checkpoint.tokenizer_of(self.path))
        if tok is None:
            raise UserError("this run was trained on pre-tokenized .bin data: there is no "
                              "tokenizer to turn text into tokens and back")
        ids = tok.encode(prompt) or [tok.eot_id]  # no prompt: a document's start
        gen = torch.Generator(device=self.device).manual_seed(seed)
        x = torch.tensor([ids], device=self.device)
        self.model.eval()
        shown = ""  # what on_text was given
        for _ in range(tokens):
            ctx = x[:, -self.model.config.max_seq_len:]
            with autocast(self.device, self.cfg.train.bf16):
                logits, _ = self.model(ctx)
            logits = logits[0, -1].float()
            if temperature <= 0:
                nxt = logits.argmax().view(1)
            else:
                logits = logits / temperature
                if top_k:
                    kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
                    logits = logits.masked_fill(logits < kth, -float("inf"))
                nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)
            x = torch.cat([x, nxt.view(1, 1)], dim=1)
            if on_text is not None:
                text = tok.decode(x[0, len(ids):].tolist()).rstrip("\ufffd")
                if len(text) > len(shown) and text.startswith(shown):
                    on_text(text[len(shown):])
                    shown = text
        return tok.decode(x[0, len(ids):].tolist())


@dataclass(frozen=True)
class _Windows:
    """``n`` strided validation batches, gathered anew on each pass over them: the batches'
    tokens are never all held at once (a list of a million batches did not fit; the window
    starts, 8 bytes a window, and one loss a batch still are)."""

    data: Batches
    batch_size: int
    seq_len: int
    n: int

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[Batch]:
        return self.data.eval_batches(self.batch_size, self.seq_len, self.n)


def load(source: Path, overrides: Mapping[str, Any] | None = None,
         flag: str = "RUN", need_data: bool = True) -> Loaded:
    """The model of ``source`` (a run directory: its newest checkpoint; or a checkpoint).
    ``need_data=False``: a missing corpus is no error (generation needs only the tokenizer).

    A run that is training may rotate its newest checkpoint away while it is read: then the
    new newest one is read instead (a live checkpoint is never called corrupt)."""
    for _ in range(ROTATION_RETRIES):
        path = checkpoint.find(Path(source), flag)
        try:
            return _load(path, overrides, flag, need_data)
        except (checkpoint.CheckpointError, OSError, SafetensorError):
            if path.is_dir() or path == Path(source):
                raise  # really damaged (or the very checkpoint named is gone)
    raise checkpoint.CheckpointRemoved(f"{flag} {source}: its checkpoints were rotated away "
                                       f"{ROTATION_RETRIES} times while being read; try again")


ROTATION_RETRIES = 5


def _load(path: Path, overrides: Mapping[str, Any] | None, flag: str,
          need_data: bool) -> Loaded:
    overrides = {"run.name": "inference", **(overrides or {})}
    cfg = C.from_sources(overrides=overrides, init_from=path)
    held = path / checkpoint.TOKENIZER_FILE
    if (cfg.data.tokenizer != "byte" and not Path(cfg.data.tokenizer).is_file()
            and held.is_file() and "data.tokenizer" not in overrides):
        cfg = C.from_sources(overrides={**overrides, "data.tokenizer": str(held)},
                             init_from=path)  # the run's tokenizer file is gone: its copy
    device = pick_device(cfg.train.device)
    ckpt = checkpoint.load(path)
    try:
        data = open_data(cfg.data, order_seed(cfg))
    except MissingFileError:
        if need_data:
            raise
        data = Batches(dataset=None, vocab_size=ckpt.meta.vocab_size,  # type: ignore
                       tokenizer=ckpt.meta.tokenizer)
    mcfg = model_config(cfg, data)
    check_compatible(ckpt, mcfg.to_dict(), data.tokenizer, flag)
    # any precision flag but the GEMMs' arithmetic replaces the checkpoint's own plan
    own = not any(k.startswith("precision.") and k != "precision.accum" for k in overrides)
    plan = PrecisionPlan.from_dict(ckpt.plan) if own else initial_plan(cfg.precision)
    model = convert(build_model(mcfg).to(device), plan, accum=cfg.precision.accum)
    ckpt.load_weights(model)
    plan.apply(model)
    label = "its plan" if own else cfg.precision.preset or Path(cfg.precision.plan).name
    return Loaded(cfg=cfg, model=model, data=data, plan=plan, step=ckpt.step, path=path,
                  device=device, precision=label)
