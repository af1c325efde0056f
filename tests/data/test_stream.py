"""Streamed tokenization (`snip.data.stream`): pieces decode exactly like the whole file, the
streamed cache equals in-memory tokenization bit for bit, and a failure leaves no cache."""

from __future__ import annotations

import errno
from pathlib import Path

import numpy as np
import pytest

from snip.data import load_dataset, stream
from snip.data.tokenizer import ByteTokenizer, train_bpe
from snip.errors import UserError

# Multi-byte characters (2, 3 and 4 bytes), invalid bytes, CRLF and lone CR (one last), a long
# line, no final newline.
TEXT = ("héllo wörld €uro 𝄞 clef\r\n" * 40 + "x" * 300 + "\n" + "old mac\rline\r\r\n"
        + "tail ünïcode\r").encode()
TEXT = TEXT[:500] + b"\xff\xfe" + TEXT[500:]


@pytest.mark.parametrize("piece_chars", [1, 3, 7, 64, 1 << 20])
def test_pieces_decode_like_the_whole_file_and_end_at_line_breaks(
        tmp_path: Path, piece_chars: int) -> None:
    f = tmp_path / "t.txt"
    f.write_bytes(TEXT)
    read = []
    pieces = list(stream.text_pieces(f, piece_chars, on_read=read.append))
    assert "".join(pieces) == f.read_text(encoding="utf-8", errors="replace")
    assert sum(read) == len(TEXT)
    for p in pieces[:-1]:  # a cut inside a line only for a line longer than 4 pieces
        assert p.endswith("\n") or len(p) >= 4 * piece_chars


def test_an_empty_file_has_no_pieces(tmp_path: Path) -> None:
    (tmp_path / "e.txt").write_bytes(b"")
    assert list(stream.text_pieces(tmp_path / "e.txt")) == []


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32])
def test_appended_npy_loads_and_keeps_a_prefix(tmp_path: Path, dtype: type) -> None:
    path = tmp_path / "a.npy"
    data = np.arange(1000, dtype=dtype)
    with stream.NpyAppender(path, np.dtype(dtype)) as out:
        for i in range(0, 1000, 300):
            out.append(data[i:i + 300])
        assert np.array_equal(np.concatenate(list(out.tail(5))), data[-5:])
        assert np.array_equal(np.concatenate(list(out.tail(700, chunk=64))), data[-700:])
        out.commit(990)
    loaded = np.load(path, mmap_mode="r")
    assert loaded.dtype == dtype and np.array_equal(loaded, data[:990])
    assert [p.name for p in tmp_path.iterdir()] == ["a.npy"]


def test_an_appender_left_without_commit_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), stream.NpyAppender(tmp_path / "a.npy", np.uint8) as out:
        out.append(np.zeros(10, np.uint8))
        raise RuntimeError("stopped")
    assert list(tmp_path.iterdir()) == []


def _corpus_dir(tmp_path: Path) -> Path:
    root = tmp_path / "texts"
    root.mkdir()
    for i in range(40):  # enough files for the hash split to give both sides
        (root / f"f{i:02d}.txt").write_bytes(TEXT[i * 7:] + f"file {i}\n".encode())
    return root


@pytest.mark.parametrize("kind", ["directory", "single file"])
@pytest.mark.parametrize("tokenizer", ["byte", "bpe"])
def test_streamed_cache_equals_in_memory_tokenizing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, tokenizer: str) -> None:
    root = _corpus_dir(tmp_path)
    source = root if kind == "directory" else root / "f00.txt"
    tok = (ByteTokenizer() if tokenizer == "byte" else
           train_bpe([TEXT.decode(errors="replace")], vocab_size=300))
    memory = load_dataset(source, tokenizer=tok, cache=False)
    # Pieces larger than any file: one piece per document, so any tokenizer is bitwise the same.
    streamed = load_dataset(source, tokenizer=tok, cache_dir=tmp_path / "c1")
    assert isinstance(streamed.train, np.memmap)
    assert np.array_equal(memory.train, streamed.train)
    assert np.array_equal(memory.val, streamed.val)
    assert streamed.train.dtype == memory.train.dtype
    if tokenizer == "byte":  # bytes: the same for pieces of any size
        monkeypatch.setattr(stream, "PIECE_CHARS", 5)
        small = load_dataset(source, tokenizer=tok, cache_dir=tmp_path / "c2")
        assert np.array_equal(memory.train, small.train)
        assert np.array_equal(memory.val, small.val)


def test_a_full_disk_while_streaming_is_one_line_and_leaves_no_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _corpus_dir(tmp_path)
    calls = []

    def full(self: stream.NpyAppender, tokens: np.ndarray) -> None:
        calls.append(1)
        if len(calls) > 3:
            self._discard()
            raise stream.atomic.write_error(OSError(errno.ENOSPC, "full"), self.path)
        real(self, tokens)

    real = stream.NpyAppender.append
    monkeypatch.setattr(stream.NpyAppender, "append", full)
    with pytest.raises(UserError, match="no space left on device"):
        load_dataset(root, cache_dir=tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []
    monkeypatch.setattr(stream.NpyAppender, "append", real)
    assert len(load_dataset(root, cache_dir=tmp_path / "cache").train) > 0


def test_an_empty_corpus_writes_no_cache(tmp_path: Path) -> None:
    root = tmp_path / "empty"
    root.mkdir()
    for i in range(3):
        (root / f"{i}.txt").write_text("")
    with pytest.raises(UserError, match="corpus is empty"):
        load_dataset(root, cache_dir=tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []


def test_a_large_corpus_shows_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture) -> None:
    root = _corpus_dir(tmp_path)
    monkeypatch.setattr(stream, "PROGRESS_MIN_BYTES", 0)
    monkeypatch.setattr(stream, "PIECE_CHARS", 64)
    real_init = stream.ByteProgress.__init__
    monkeypatch.setattr(stream.ByteProgress, "__init__",
                        lambda self, total, what, every=0.0: real_init(self, total, what, 0.0))
    load_dataset(root, cache_dir=tmp_path / "cache")
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("tokenizing the text corpus: ") and "MB/s" in err[0]
    assert err[-1].startswith("tokenized the text corpus: ")
