"""The trainer's view of the data: global batches as a pure function of the step.

`open_data(cfg.data, seed)` wraps a `snip.data.TokenDataset` (embedded corpus, byte or BPE
tokens, text/dir/.bin sources) as a `Batches` with

* ``train_batch(step, batch_size, seq_len)``: the *global* batch of optimizer step ``step``.
  Every rank draws the same one and keeps its own contiguous rows (``loop.local_rows``), which
  is exactly snip.data's sharding rule, so N ranks see the rows one rank would;
* ``eval_batches(batch_size, seq_len, n)``: the same ``n`` held-out batches at every evaluation,
  spread evenly over the whole validation split;
* ``vocab_size`` and ``tokenizer`` (an identifier that ``--resume`` checks).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from snip.data import TokenDataset
from snip.errors import UserError
from snip.train.config import DataSection

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass
class Batches:
    dataset: TokenDataset
    vocab_size: int
    tokenizer: str

    def train_batch(self, step: int, batch_size: int, seq_len: int) -> Batch:
        return self.dataset.get_batch("train", batch_size, seq_len, step)

    def eval_batches(self, batch_size: int, seq_len: int, n: int) -> Iterator[Batch]:
        yield from self.dataset.strided_batches("val", batch_size, seq_len, n)


def open_data(cfg: DataSection, seed: int) -> Batches:
    """Load (and on first use tokenize and cache) the configured corpus."""
    from snip.data import load_dataset

    ds = load_dataset(cfg.path or None, tokenizer=cfg.tokenizer, val_fraction=cfg.val_fraction,
                      seed=seed, allow_binary=cfg.allow_binary, vocab_size=cfg.vocab_size or None)
    if len(ds.train) == 0 or len(ds.val) == 0:
        raise UserError(f"data.path {cfg.path or '(embedded corpus)'!r} gives an empty train or "
                        "validation split (empty corpus?); add text or lower data.val_fraction")
    return Batches(dataset=ds, vocab_size=ds.vocab_size, tokenizer=_tokenizer_id(ds))


def _tokenizer_id(ds: TokenDataset) -> str:
    """A short name that changes whenever the token ids would mean something else."""
    if ds.tokenizer is None:
        return f"pretokenized:{ds.vocab_size}"
    digest = hashlib.sha1(json.dumps(ds.tokenizer.to_dict(), sort_keys=True).encode())
    return f"{type(ds.tokenizer).__name__}:{ds.vocab_size}:{digest.hexdigest()[:12]}"
