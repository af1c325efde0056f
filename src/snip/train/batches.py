"""The trainer's view of the data: global batches as a pure function of the step.

`open_data(cfg.data, seed)` returns a `Batches` with

* ``train_batch(step, batch_size, seq_len)``: the *global* batch of optimizer step ``step``
  (every rank computes the same one and keeps its own rows, see ``loop.local_rows``), so a
  resumed run only needs the step to continue the data stream, and N ranks see exactly the
  rows one rank would;
* ``eval_batches(batch_size, seq_len, n)``: the same ``n`` held-out batches at every evaluation;
* ``vocab_size`` and ``tokenizer`` (an identifier, checked on resume).

It delegates to ``snip.data`` (embedded corpus, byte and BPE tokenizers, text/dir/.bin data)
and only falls back to a minimal byte-level reader of the same sources when that package is not
installed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from snip.train.config import DataSection

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass
class Batches:
    train: torch.Tensor  # 1-D int64 token stream of each split
    val: torch.Tensor
    vocab_size: int
    tokenizer: str
    seed: int

    def _sample(self, tokens: torch.Tensor, key: int, batch_size: int, seq_len: int) -> Batch:
        n = tokens.numel() - seq_len - 1
        if n < 1:
            raise ValueError(f"the corpus split has {tokens.numel()} tokens, fewer than "
                             f"train.seq_len + 1 = {seq_len + 1}; use a larger corpus or "
                             "a shorter train.seq_len")
        g = torch.Generator().manual_seed(key)
        starts = torch.randint(n, (batch_size,), generator=g)
        idx = starts[:, None] + torch.arange(seq_len + 1)
        rows = tokens[idx]
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def train_batch(self, step: int, batch_size: int, seq_len: int) -> Batch:
        return self._sample(self.train, self.seed * 1_000_003 + step, batch_size, seq_len)

    def eval_batches(self, batch_size: int, seq_len: int, n: int) -> Iterator[Batch]:
        for i in range(n):
            yield self._sample(self.val, -(self.seed * 1_000_003 + i) - 1, batch_size, seq_len)


def open_data(cfg: DataSection, seed: int) -> Batches:
    """Tokenize the configured corpus and split it into train and validation streams."""
    tokens, vocab_size, tokenizer = _read_tokens(cfg)
    n_val = max(1, int(len(tokens) * cfg.val_fraction))
    train, val = tokens[:-n_val], tokens[-n_val:]
    return Batches(train=train, val=val, vocab_size=vocab_size, tokenizer=tokenizer, seed=seed)


def _read_tokens(cfg: DataSection) -> tuple[torch.Tensor, int, str]:
    if cfg.tokenizer != "byte":
        raise ValueError(f"data.tokenizer {cfg.tokenizer!r} needs snip.data (BPE); only "
                         "'byte' is available in this installation")
    if not cfg.path:
        return _bytes_to_tensor(_embedded_corpus()), 256, "byte"
    path = Path(cfg.path)
    if not path.exists():
        raise FileNotFoundError(f"data.path {str(path)!r} does not exist")
    if path.suffix == ".bin":
        size = path.stat().st_size
        if size % 2:
            raise ValueError(f"data.path {str(path)!r}: {size} bytes is not a whole number of "
                             "uint16 tokens")
        if size == 0:
            raise ValueError(f"data.path {str(path)!r} is empty")
        tokens = torch.from_numpy(np.fromfile(path, dtype=np.uint16).astype(np.int64))
        return tokens, int(tokens.max()) + 1, "bin"
    files = sorted(path.rglob("*")) if path.is_dir() else [path]
    data = b"".join(f.read_bytes() for f in files if f.is_file())
    if not data:
        raise ValueError(f"data.path {str(path)!r} holds no text (empty corpus)")
    return _bytes_to_tensor(data), 256, "byte"


def _bytes_to_tensor(data: bytes) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(data, dtype=np.uint8).astype(np.int64))


def _embedded_corpus(max_bytes: int = 4_000_000) -> bytes:
    """Python standard-library sources, a fixed sorted list of files (deterministic)."""
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    out, total = [], 0
    for f in sorted(stdlib.glob("*.py")):
        b = f.read_bytes()
        out.append(b)
        total += len(b)
        if total >= max_bytes:
            break
    return b"".join(out)
