"""Tokenizing a corpus of any size in bounded memory, straight into the on-disk cache.

A 10 GB text corpus must not be read whole: its Python string alone would take up to 40 GB. So
`snip.data.corpus` tokenizes the documents as a stream of *pieces* and appends each piece's
tokens to the cache file, which is then memory-mapped like any other:

    file bytes --(incremental UTF-8 decoder)--> text --(cut after a line break)--> pieces
    piece --tokenizer--> tokens --append--> .NAME.npy.tmp-<pid> --rename--> NAME.npy

- **Pieces** (`text_pieces`): about `PIECE_CHARS` characters each, cut just after the last
  line break in the block read, so no token spans a cut except where a line is longer than four
  pieces.  Bytes are decoded incrementally and newlines translated as Python's universal
  newlines do, so their concatenation is exactly `Path.read_text(errors="replace")`.  A document
  smaller than a piece (every file of the built-in corpus) is one piece: its tokens equal
  whole-text tokenization bit for bit, for any tokenizer; for the byte tokenizer this holds for
  every size.  A BPE tokenizer may merge whitespace across a line break differently at a cut
  (one cut per `PIECE_CHARS`).
- **Files** (`NpyAppender`): a `.npy` whose length is not known in advance.  Its header is
  written with room for any length, the tokens are appended, and the header is rewritten with
  the true length at the end (the `.npy` v1.0 format pads its header with spaces to a multiple
  of 64 bytes, so a fixed-size header is a valid one).  Written beside the target under a
  temporary name and renamed into place (`snip.atomic`); removed on any error.
- **Progress** (`ByteProgress`): a line on stderr every few seconds for corpora above
  `PROGRESS_MIN_BYTES`: bytes done, rate and time left.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from snip import atomic

PIECE_CHARS = 4 << 20  # about this many characters of text are tokenized at once
PROGRESS_MIN_BYTES = 64 << 20  # smaller corpora tokenize in seconds: no progress line
_HEADER_BYTES = 128  # the .npy v1.0 header (magic, version, length, dict, padding)


def text_pieces(path: Path, piece_chars: int | None = None,
                on_read: Callable[[int], None] | None = None) -> Iterator[str]:
    """The text of ``path`` (UTF-8, invalid bytes replaced) in pieces of about ``piece_chars``
    characters (default `PIECE_CHARS`) that end just after a line break (module docstring);
    ``on_read`` is told the number of bytes of every block read."""
    piece_chars = piece_chars or PIECE_CHARS
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    carry, cr = "", ""
    # Bytes decoded incrementally, then universal newlines as read_text does them.  (Not a text
    # file object: CPython 3.11's TextIOWrapper.read(n) keeps ~n bytes per call, 1 GB for 1 GB.)
    with open(path, "rb") as f:
        while True:
            block = f.read(piece_chars)
            if on_read is not None:
                on_read(len(block))
            text = cr + decoder.decode(block, final=not block)
            cr = "\r" if block and text.endswith("\r") else ""  # its "\n" may come next
            text = carry + (text[:-1] if cr else text).replace("\r\n", "\n").replace("\r", "\n")
            if not block:
                if text:
                    yield text
                return
            cut = text.rfind("\n") + 1
            if cut == 0 and len(text) >= 4 * piece_chars:  # a very long line: cut anyway
                cut = len(text)
            if cut:
                yield text[:cut]
            carry = text[cut:]


class NpyAppender:
    """A one-dimensional ``.npy`` file of ``dtype`` written by appending (module docstring).

    Use as a context manager: on a clean exit `commit` must have been called (it renames the
    file into place); on an error the temporary is removed."""

    def __init__(self, path: Path, dtype: np.dtype) -> None:
        self.path, self.dtype, self.length = path, np.dtype(dtype), 0
        atomic.clean_stale(path)
        self.tmp = atomic.temp_path(path)
        self._f: BinaryIO | None = None

    def __enter__(self) -> NpyAppender:
        try:
            self._f = open(self.tmp, "wb")  # noqa: SIM115 (closed in commit or __exit__)
            self._write_header()
        except OSError as e:
            self._discard()
            raise atomic.write_error(e, self.path) from None
        return self

    def __exit__(self, kind: object, error: object, tb: object) -> None:
        if self._f is not None:  # not committed: an error, or the caller gave up
            self._discard()

    def _write_header(self) -> None:
        assert self._f is not None
        header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False,
                  "shape": (self.length,)}
        text = repr(header).encode("latin1")
        pad = _HEADER_BYTES - 10 - len(text) - 1
        self._f.seek(0)
        self._f.write(b"\x93NUMPY\x01\x00" + (_HEADER_BYTES - 10).to_bytes(2, "little")
                      + text + b" " * pad + b"\n")

    def append(self, tokens: np.ndarray) -> None:
        assert self._f is not None
        try:
            self._f.write(np.ascontiguousarray(tokens, dtype=self.dtype).tobytes())
        except OSError as e:
            self._discard()
            raise atomic.write_error(e, self.path) from None
        self.length += len(tokens)

    def tail(self, n: int, chunk: int = 1 << 22) -> Iterator[np.ndarray]:
        """The last ``n`` tokens appended so far, in copies of at most ``chunk`` tokens."""
        assert self._f is not None
        self._f.flush()
        for start in range(self.length - n, self.length, chunk):
            offset = _HEADER_BYTES + start * self.dtype.itemsize
            yield np.fromfile(self.tmp, dtype=self.dtype, offset=offset,
                              count=min(chunk, self.length - start))

    def commit(self, length: int | None = None) -> None:
        """Keep the first ``length`` tokens (all by default) and rename the file into place."""
        assert self._f is not None
        try:
            if length is not None:
                self.length = length
                self._f.truncate(_HEADER_BYTES + length * self.dtype.itemsize)
            self._write_header()
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
            self._f = None
            os.replace(self.tmp, self.path)
        except OSError as e:
            self._discard()
            raise atomic.write_error(e, self.path) from None

    def _discard(self) -> None:
        if self._f is not None:
            with contextlib.suppress(OSError):
                self._f.close()
            self._f = None
        with contextlib.suppress(OSError):
            self.tmp.unlink()


class ByteProgress:
    """``tokenizing the text corpus: 1.2 of 10.0 GiB (12%), 45 MB/s, 3:20 left`` on stderr,
    at most every ``every`` seconds, for a total of at least `PROGRESS_MIN_BYTES`."""

    def __init__(self, total: int, what: str, every: float = 5.0) -> None:
        self.total, self.what, self.every, self.done = total, what, every, 0
        self.on = total >= PROGRESS_MIN_BYTES
        self._t0 = self._last = time.monotonic()

    def update(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self.on and now - self._last >= self.every:
            self._last = now
            rate = self.done / max(now - self._t0, 1e-9)
            left = int((self.total - self.done) / max(rate, 1.0))
            print(f"tokenizing {self.what}: {self.done / 2**30:.1f} of "
                  f"{self.total / 2**30:.1f} GiB ({100 * self.done / self.total:.0f}%), "
                  f"{rate / 1e6:.0f} MB/s, {left // 60}:{left % 60:02d} left",
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.on:
            took = time.monotonic() - self._t0
            print(f"tokenized {self.what}: {self.total / 2**30:.1f} GiB in {took:.0f} s",
                  file=sys.stderr, flush=True)
