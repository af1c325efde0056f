"""Token datasets and a stateless batch sampler that makes resuming and sharding exact.

`load_dataset(source)` turns one of these into a `TokenDataset` holding a train and a val stream:

    None                   the built-in corpus (the Python standard library, see corpus.py)
    a text file            one document, split by its tail (last val_fraction of tokens)
    a directory            its text files, split by path hash (see corpus.py)
    a .bin file            nanoGPT-style uint16 tokens, memory-mapped, split by its tail
    a dir with train.bin   nanoGPT's prepare.py output: train.bin and (optionally) val.bin

Batches carry no iterator state. The token windows of training step `step` are drawn from a
generator seeded by (seed, split, step) alone:

    starts = rng(seed, split, step).integers(0, len(tokens) - seq_len, batch_size * world_size)
    rank r takes starts[r * batch_size : (r + 1) * batch_size]

so (1) restarting at step N from a checkpoint reproduces exactly the batches an uninterrupted
run would have seen, with nothing to save but N, and (2) the union of the ranks' batches at a
step, in rank order, is the batch one process would draw with batch_size * world_size: a data-
parallel run sees the same data as a single-device run with the same global batch.
Evaluation reads fixed windows instead, so validation losses are comparable across steps and
runs: `strided_batches` spreads them evenly over the whole split (what the trainer uses), and
`iter_eval_batches` walks the split from its start.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from snip.data.corpus import (
    DEFAULT_VAL_FRACTION,
    stdlib_documents,
    tail_split,
    text_documents,
    tokenize_corpus,
)
from snip.data.tokenizer import Tokenizer, load_tokenizer
from snip.errors import MissingFileError, UserError

SPLITS = ("train", "val")


def load_bin(path: str | Path) -> np.memmap:
    """Memory-map a file of native-endian uint16 tokens (nanoGPT's format)."""
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"token file {path} does not exist; check the path")
    size = path.stat().st_size
    if size == 0:
        raise UserError(f"token file {path} is empty; regenerate it or point to another file")
    if size % 2:
        raise UserError(
            f"token file {path} has {size} bytes, not a whole number of uint16 tokens; "
            "it is truncated or not a uint16 token file"
        )
    return np.memmap(path, dtype=np.uint16, mode="r")


@dataclass(frozen=True, eq=False)
class TokenDataset:
    """Train and val token streams (1-D integer arrays, often memory-mapped)."""

    train: np.ndarray
    val: np.ndarray
    vocab_size: int
    seed: int = 0
    tokenizer: Tokenizer | None = None  # None for pre-tokenized .bin data

    def __post_init__(self) -> None:
        for split in SPLITS:
            a = getattr(self, split)
            if a.ndim != 1 or not np.issubdtype(a.dtype, np.integer):
                raise UserError(f"{split} tokens must be a 1-D integer array, not {a.dtype}")
        if self.vocab_size <= 0:
            raise UserError(f"vocab_size={self.vocab_size} must be positive")

    def tokens(self, split: str) -> np.ndarray:
        if split not in SPLITS:
            raise UserError(f"split={split!r} must be 'train' or 'val'")
        return self.train if split == "train" else self.val

    def check_seq_len(self, seq_len: int) -> None:
        """Raise unless both splits hold at least ``seq_len + 1`` tokens: called before a run
        touches its directory, so a corpus too small fails first and loses nothing."""
        for split in SPLITS:
            self._windows(split, seq_len)

    def _windows(self, split: str, seq_len: int) -> np.ndarray:
        tokens = self.tokens(split)
        if seq_len <= 0:
            raise UserError(f"seq_len={seq_len} must be positive")
        if len(tokens) <= seq_len:
            raise UserError(
                f"the {split} split has {len(tokens)} tokens, too few for seq_len={seq_len} "
                "(needs seq_len + 1); use a shorter seq_len or more data"
            )
        return tokens

    def get_batch(
        self,
        split: str,
        batch_size: int,
        seq_len: int,
        step: int,
        rank: int = 0,
        world_size: int = 1,
        device: torch.device | str | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs x and next-token targets y, both (batch_size, seq_len) int64; a pure function
        of (seed, split, step, rank, world_size) and the data."""
        if not 0 <= rank < world_size:
            raise UserError(f"rank={rank} must be in [0, world_size={world_size})")
        if batch_size <= 0 or step < 0:
            raise UserError(f"batch_size={batch_size} must be > 0 and step={step} >= 0")
        tokens = self._windows(split, seq_len)
        rng = np.random.default_rng([self.seed, SPLITS.index(split), step])
        starts = rng.integers(0, len(tokens) - seq_len, size=batch_size * world_size)
        starts = starts[rank * batch_size : (rank + 1) * batch_size]
        return _gather(tokens, starts, seq_len, device)

    def iter_eval_batches(
        self,
        split: str,
        batch_size: int,
        seq_len: int,
        max_batches: int | None = None,
        rank: int = 0,
        world_size: int = 1,
        device: torch.device | str | None = None,
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Consecutive non-overlapping windows from the start of the split, batch_size at a
        time (the last batch may be smaller); batch i goes to rank i % world_size."""
        tokens = self._windows(split, seq_len)
        starts = np.arange(0, len(tokens) - seq_len, seq_len)
        n_batches = -(-len(starts) // batch_size)
        if max_batches is not None:
            n_batches = min(n_batches, max_batches)
        for i in range(rank, n_batches, world_size):
            yield _gather(tokens, starts[i * batch_size : (i + 1) * batch_size], seq_len, device)


    def strided_batches(
        self,
        split: str,
        batch_size: int,
        seq_len: int,
        n_batches: int,
        device: torch.device | str | None = None,
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``n_batches`` batches of windows spread evenly over the *whole* split: window ``i`` of
        ``n = n_batches * batch_size`` starts at ``round(i * (len - seq_len - 1) / (n - 1))``.

        The first ``n`` consecutive windows would measure one corner of the corpus (one file of
        the default corpus, say); evenly strided windows sample all of it, so two evaluations of
        the same model agree closely and small differences between models can resolve. The
        windows depend on nothing but the split and the sizes: every run, arm and evaluation of
        the same data sees the same ones."""
        tokens = self._windows(split, seq_len)
        if n_batches <= 0 or batch_size <= 0:
            raise UserError(f"n_batches={n_batches} and batch_size={batch_size} must be > 0")
        n = n_batches * batch_size
        last = len(tokens) - seq_len - 1
        starts = np.rint(np.linspace(0, last, n)).astype(np.int64) if n > 1 else np.zeros(1, int)
        for i in range(n_batches):
            yield _gather(tokens, starts[i * batch_size : (i + 1) * batch_size], seq_len, device)


def _gather(
    tokens: np.ndarray, starts: np.ndarray, seq_len: int, device: torch.device | str | None
) -> tuple[torch.Tensor, torch.Tensor]:
    # One (B, T+1) copy out of the (possibly memory-mapped) stream, then two shifted views.
    rows = np.stack([tokens[s : s + seq_len + 1] for s in starts]).astype(np.int64)
    xy = torch.from_numpy(rows)
    if device is not None:
        xy = xy.to(device)
    return xy[:, :-1], xy[:, 1:]


def _load_bin_source(path: Path, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    if path.is_dir():
        train = load_bin(path / "train.bin")
        if (path / "val.bin").exists():
            return train, load_bin(path / "val.bin")
        return tail_split(train, val_fraction)
    return tail_split(load_bin(path), val_fraction)


def load_dataset(
    source: str | Path | None = None,
    *,
    tokenizer: Tokenizer | str | Path = "byte",
    val_fraction: float = DEFAULT_VAL_FRACTION,
    seed: int = 0,
    cache_dir: str | Path | None = None,
    cache: bool = True,
    max_files: int | None = None,
    pattern: str = "**/*",
    vocab_size: int | None = None,
    allow_binary: bool = False,
) -> TokenDataset:
    """A TokenDataset from `source` (see the module docstring for the accepted kinds).

    For .bin data the tokenizer only gives the vocabulary size (``vocab_size`` overrides it):
    the vocabulary never comes from the data, and a token id outside it is an error naming the
    id and its position. `max_files` takes the first files of the sorted built-in corpus, for
    quick tests. A single text file that looks binary is refused unless ``allow_binary``."""
    if source is not None and _is_bin_source(Path(source)):
        train, val = _load_bin_source(Path(source), val_fraction)
        if vocab_size is None:
            vocab_size = load_tokenizer(tokenizer).vocab_size
        for split, tokens in (("train", train), ("val", val)):
            _check_ids(tokens, vocab_size, f"{source} ({split} split)")
        return TokenDataset(train=train, val=val, vocab_size=vocab_size, seed=seed)
    tok = load_tokenizer(tokenizer)
    if source is None:
        docs, name = stdlib_documents(max_files), "stdlib"
    else:
        docs, name = text_documents(source, pattern, allow_binary), "text"
    train, val = tokenize_corpus(docs, tok, val_fraction, cache_dir, cache, name)
    if vocab_size is not None and vocab_size < tok.vocab_size:
        raise UserError(f"vocab_size={vocab_size} < the tokenizer's {tok.vocab_size}")
    return TokenDataset(
        train=train, val=val, vocab_size=vocab_size or tok.vocab_size, seed=seed, tokenizer=tok
    )


def _check_ids(tokens: np.ndarray, vocab_size: int, where: str) -> None:
    if len(tokens) and int(tokens.max()) >= vocab_size:
        pos = int(np.argmax(tokens >= vocab_size))
        raise UserError(f"token id {int(tokens[pos])} at position {pos} of {where} is outside "
                        f"the vocabulary of {vocab_size} ids; pass the tokenizer the file was "
                        "made with (--data.tokenizer) or --data.vocab_size")


def _is_bin_source(path: Path) -> bool:
    return path.suffix == ".bin" or (path.is_dir() and (path / "train.bin").is_file())
