"""Text corpora: which files, which split, and the token stream they become (cached on disk).

The default corpus ships with every Python: the standard library's own `.py` sources (about 12 MB
over ~700 files for CPython 3.11, with `site-packages` and the `test`/`tests` directories left
out). It needs no download, is real human-written text with long-range structure (indentation,
matching names, docstrings), and a byte-level model learns it visibly within a few thousand steps.

Data flow:

    documents (sorted relative paths) -> split by path hash -> read -> tokenize -> one uint8/16
    stream per split, documents separated by the tokenizer's end-of-text id -> cached .npy files

- Order: documents are sorted by their relative POSIX path, so every machine walks them the same
  way, whatever the file system's listing order.
- Split: a document goes to validation when the first 8 bytes of sha1(relative path), read as a
  fraction of 2^64, fall below `val_fraction`. The choice depends only on the path, so it is the
  same on every run and machine and a file never migrates between splits when others are added.
  (Python's built-in `hash()` of a str is salted per process and must not be used here.)
  When the hash leaves one side empty (a single file, a handful of files) the concatenated stream
  is split instead: its last `val_fraction` of tokens become validation.
- Cache: the two streams are saved as `.npy` files whose name hashes the interpreter version, the
  tokenizer, the split fraction and a fingerprint of the documents (relative path, size, mtime),
  so a second run only stats the files and memory-maps the arrays. The corpus is tokenized
  piece by piece straight into these files (`snip.data.stream`), so its size is bounded by the
  disk, not the memory, with a progress line for large corpora. Files are written to a temporary
  name and moved into place with `os.replace`, which is atomic: concurrent runs (one per rank)
  either see a complete file or none.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from snip import atomic
from snip.data import stream
from snip.data.tokenizer import Tokenizer
from snip.errors import MissingFileError, UserError

DEFAULT_VAL_FRACTION = 0.05
STDLIB_EXCLUDE = frozenset({"site-packages", "dist-packages", "__pycache__", "test", "tests",
                            "idle_test"})
_CACHE_FORMAT = 1


@dataclass(frozen=True)
class Document:
    relpath: str  # POSIX path relative to the corpus root: the sort and split key
    path: Path


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_documents(max_files: int | None = None) -> list[Document]:
    """The interpreter's standard-library `.py` files, sorted; the first `max_files` if given."""
    root = stdlib_root()
    docs = []
    for dirpath, dirnames, filenames in os.walk(root):
        # Prune in place so os.walk never descends into site-packages (often far bigger).
        dirnames[:] = [d for d in dirnames if d not in STDLIB_EXCLUDE]
        for f in filenames:
            if f.endswith(".py"):
                path = Path(dirpath, f)
                docs.append(Document(path.relative_to(root).as_posix(), path))
    docs.sort(key=lambda d: d.relpath)
    return docs[:max_files]


# A file is "binary" if its first 8 KB hold a NUL byte or more than this share of bytes that
# are not valid UTF-8 (text in a legacy encoding has a few; executables and archives many).
BINARY_SNIFF = 8192
MAX_INVALID_UTF8 = 0.1


def binary_reason(path: Path) -> str | None:
    """Why ``path`` looks like binary data rather than text (None if it looks like text)."""
    with open(path, "rb") as f:
        head = f.read(BINARY_SNIFF)
    if b"\0" in head:
        return "it has NUL bytes"
    text = head.decode("utf-8", errors="replace")
    # a multi-byte character cut at the end of the sample is not an error
    invalid = text[:-1].count("\ufffd") if len(head) == BINARY_SNIFF else text.count("\ufffd")
    if head and invalid > MAX_INVALID_UTF8 * len(head):
        return f"{invalid / len(head):.0%} of its first bytes are not valid UTF-8"
    return None


def _looks_binary(path: Path) -> bool:
    return binary_reason(path) is not None


def text_documents(path: str | Path, pattern: str = "**/*",
                   allow_binary: bool = False) -> list[Document]:
    """A text file, or the text files under a directory matching `pattern`, sorted. Hidden
    files and binary files (NUL bytes or mostly invalid UTF-8 in their first 8 KB) are skipped
    in a directory; a single binary file is refused unless ``allow_binary``."""
    path = Path(path)
    if not path.exists():
        raise MissingFileError(
            f"data path {path} does not exist; pass an existing text file or directory, "
            "or omit it to use the built-in corpus"
        )
    if path.is_file():
        reason = None if allow_binary else binary_reason(path)
        if reason:
            raise UserError(f"data.path {str(path)!r} does not look like text ({reason}); pass "
                            "a text file, a .bin token file, or --data.allow_binary true")
        return [Document(path.name, path)]
    docs = []
    for p in path.glob(pattern):
        rel = p.relative_to(path)
        if p.is_file() and not any(part.startswith(".") for part in rel.parts):
            if not _looks_binary(p):
                docs.append(Document(rel.as_posix(), p))
    if not docs:
        raise UserError(
            f"no text files match {pattern!r} under {path}; add text files there or pass a "
            "different pattern"
        )
    return sorted(docs, key=lambda d: d.relpath)


def is_validation(relpath: str, val_fraction: float) -> bool:
    """Stable split: sha1 of the path as a number in [0, 1), compared with the fraction."""
    h = int.from_bytes(hashlib.sha1(relpath.encode("utf-8")).digest()[:8], "big")
    return h / 2**64 < val_fraction


def split_documents(
    docs: Sequence[Document], val_fraction: float = DEFAULT_VAL_FRACTION
) -> tuple[list[Document], list[Document]]:
    _check_fraction(val_fraction)
    train = [d for d in docs if not is_validation(d.relpath, val_fraction)]
    val = [d for d in docs if is_validation(d.relpath, val_fraction)]
    return train, val


def _check_fraction(val_fraction: float) -> None:
    if not 0.0 <= val_fraction < 1.0:
        raise UserError(f"val_fraction={val_fraction} must be in [0, 1)")


def read_text(path: Path) -> str:
    # errors="replace": a stray latin-1 byte should cost one character, not the whole run.
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror or e}; check its permissions") from e


def iter_texts(
    docs: Sequence[Document], split: str = "train", val_fraction: float = DEFAULT_VAL_FRACTION
) -> Iterator[str]:
    """The texts of one split, in order: what a BPE tokenizer should be trained on."""
    train, val = split_documents(docs, val_fraction)
    if split not in ("train", "val"):
        raise UserError(f"split={split!r} must be 'train' or 'val'")
    for d in train if split == "train" else val:
        yield read_text(d.path)


def _token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint8 if vocab_size <= 256 else np.uint16 if vocab_size <= 65536 else
                    np.uint32)


def tokenize_documents(docs: Sequence[Document], tokenizer: Tokenizer) -> np.ndarray:
    """One stream: each document's tokens followed by the end-of-text id."""
    dtype = _token_dtype(tokenizer.vocab_size)
    eot = np.array([tokenizer.eot_id], dtype=dtype)
    # encode_array, where a tokenizer has it, skips a Python int per token (12M for bytes).
    encode = getattr(tokenizer, "encode_array", None) or tokenizer.encode
    _check_fits(docs)
    parts = []
    for d in docs:
        parts += [np.asarray(encode(read_text(d.path)), dtype=dtype), eot]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


# Tokenizing in memory holds a document's text (up to 4 bytes per character in a Python str),
# its tokens and the stream so far: about this many bytes per byte of text, at most.
TOKENIZE_BYTES_PER_BYTE = 8


def _check_fits(docs: Sequence[Document]) -> None:
    """Refuse a text corpus too large to tokenize in the memory free now (one line, before
    reading it), instead of growing until the kernel kills the process."""
    from snip.runtime import mem_available

    size = sum(d.path.stat().st_size for d in docs if d.path.is_file())
    free = mem_available()
    if free is not None and size * TOKENIZE_BYTES_PER_BYTE > free:
        raise UserError(
            f"the text corpus is {size / 2**30:.1f} GiB; tokenizing it in memory needs about "
            f"{size * TOKENIZE_BYTES_PER_BYTE / 2**30:.1f} GiB but {free / 2**30:.1f} GiB is "
            "free: tokenize it with the cache on (streamed to disk), pre-tokenize it into a "
            ".bin token file (read memory-mapped) or use a part of it")


def default_cache_dir() -> Path:
    if "SNIP_CACHE_DIR" in os.environ:
        return Path(os.environ["SNIP_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "snip"


def _fingerprint(docs: Sequence[Document], tokenizer: Tokenizer, val_fraction: float) -> str:
    stats = [(str(d.path.absolute()), d.path.stat().st_size, d.path.stat().st_mtime_ns)
             for d in docs]
    key = {
        "format": _CACHE_FORMAT,
        "python": sys.version,
        "tokenizer": tokenizer.to_dict(),
        "val_fraction": val_fraction,
        "docs": stats,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]


def tail_split(tokens: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """The last `val_fraction` of a stream (at least one token) as val, the rest as train."""
    n_val = int(len(tokens) * val_fraction)
    if val_fraction > 0:
        n_val = max(n_val, 1)
    return tokens[: len(tokens) - n_val], tokens[len(tokens) - n_val :]


def tokenize_corpus(
    docs: Sequence[Document],
    tokenizer: Tokenizer,
    val_fraction: float = DEFAULT_VAL_FRACTION,
    cache_dir: str | Path | None = None,
    cache: bool = True,
    name: str = "corpus",
) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) token streams for `docs`, loaded from the cache when it is current.

    With the cache (the default) the corpus is tokenized piece by piece straight into the
    cache files and memory-mapped (`snip.data.stream`): any size fits in memory.  Without it
    the streams are built in memory, and a corpus too large for that is refused."""
    train_docs, val_docs = split_documents(docs, val_fraction)
    tail = val_fraction > 0 and not (train_docs and val_docs)  # split the stream, not the files
    if not cache:
        if tail:
            train, val = tail_split(tokenize_documents(docs, tokenizer), val_fraction)
        else:
            train = tokenize_documents(train_docs, tokenizer)
            val = tokenize_documents(val_docs, tokenizer)
        _check_not_empty(len(train) + len(val), docs, name)
        return train, val
    stem = f"{name}-py{sys.version_info[0]}.{sys.version_info[1]}-{tokenizer.name}-"
    stem += _fingerprint(docs, tokenizer, val_fraction)
    root = Path(cache_dir or default_cache_dir())
    paths = [root / f"{stem}-{split}.npy" for split in ("train", "val")]
    if not all(p.exists() for p in paths):
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise atomic.write_error(e, root) from None
        _stream_corpus(docs, train_docs, val_docs, tail, val_fraction, tokenizer, paths, name)
    return tuple(np.load(p, mmap_mode="r") for p in paths)


def _stream_corpus(docs: Sequence[Document], train_docs: Sequence[Document],
                   val_docs: Sequence[Document], tail: bool, val_fraction: float,
                   tokenizer: Tokenizer, paths: Sequence[Path], name: str) -> None:
    """Tokenize into the two cache files (`snip.data.stream`); the val file first, so a
    complete train file means a complete cache."""
    dtype = _token_dtype(tokenizer.vocab_size)
    encode = getattr(tokenizer, "encode_array", None) or tokenizer.encode
    eot = np.array([tokenizer.eot_id], dtype=dtype)
    progress = stream.ByteProgress(sum(_size(d) for d in docs), f"the {name} corpus")

    def write(out: stream.NpyAppender, split: Sequence[Document]) -> None:
        for d in split:
            try:
                for piece in stream.text_pieces(d.path, on_read=progress.update):
                    out.append(np.asarray(encode(piece), dtype=dtype))
            except OSError as e:
                raise UserError(f"cannot read {d.path}: {e.strerror or e}; check its "
                                "permissions") from None
            out.append(eot)

    with stream.NpyAppender(paths[0], dtype) as train, stream.NpyAppender(paths[1], dtype) as val:
        write(train, docs if tail else train_docs)
        if not tail:
            write(val, val_docs)
        _check_not_empty(train.length + val.length, docs, name)
        if tail:
            n_val = max(int(train.length * val_fraction), 1)
            for part in train.tail(n_val):
                val.append(part)
            val.commit()
            train.commit(train.length - n_val)
        else:
            val.commit()
            train.commit()
    progress.close()


def _size(d: Document) -> int:
    try:
        return d.path.stat().st_size
    except OSError:
        return 0


def _check_not_empty(n_tokens: int, docs: Sequence[Document], name: str) -> None:
    if n_tokens <= len(docs):  # nothing but one end-of-text id per document
        raise UserError(
            f"the {name} corpus is empty ({len(docs)} document{'s' * (len(docs) != 1)}, no "
            "text); add text or point to another source"
        )
