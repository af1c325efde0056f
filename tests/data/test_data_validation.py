"""Bad corpora are refused when opened, naming the file and the fix (issue 14).

* binary data given as a text file (an executable) used to train silently;
* a .bin whose ids exceed the tokenizer's vocabulary used to grow the vocabulary to max id + 1;
* a corpus too small for seq_len used to fail only after the run directory was rewritten.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from snip.data import load_dataset
from snip.errors import UserError


def test_binary_text_file_is_refused(tmp_path: Path) -> None:
    exe = Path(sys.executable).resolve()
    with pytest.raises(UserError, match="does not look like text.*allow_binary"):
        load_dataset(exe)
    latin = tmp_path / "latin.bin.txt"
    latin.write_bytes(bytes(range(128, 256)) * 40)  # no NUL, but not UTF-8 at all
    with pytest.raises(UserError, match="not valid UTF-8"):
        load_dataset(latin)
    ds = load_dataset(latin, allow_binary=True, cache=False)
    assert len(ds.train) > 0


def test_text_with_a_few_bad_bytes_is_text(tmp_path: Path) -> None:
    f = tmp_path / "a.txt"
    f.write_bytes(("hello world, caf\u00e9 " * 200).encode() + b"\xff\xfe" + b"more text " * 50)
    assert len(load_dataset(f, cache=False).train) > 0


def test_bin_ids_are_checked_against_the_tokenizer(tmp_path: Path) -> None:
    tokens = np.arange(1000, dtype=np.uint16) % 256
    tokens[321] = 50000
    tokens.tofile(tmp_path / "data.bin")
    with pytest.raises(UserError, match="token id 50000 at position 321 .* 256 ids"):
        load_dataset(tmp_path / "data.bin")
    ds = load_dataset(tmp_path / "data.bin", vocab_size=65536)
    assert ds.vocab_size == 65536  # explicit: never taken from the data
    small = np.arange(1000, dtype=np.uint16) % 100
    small.tofile(tmp_path / "small.bin")
    assert load_dataset(tmp_path / "small.bin").vocab_size == 256  # the byte tokenizer's


def test_check_seq_len_names_the_split(tmp_path: Path) -> None:
    f = tmp_path / "tiny.txt"
    f.write_text("x" * 300)
    ds = load_dataset(f, cache=False, val_fraction=0.1)
    ds.check_seq_len(16)
    with pytest.raises(UserError, match="val split has .* too few for seq_len=64"):
        ds.check_seq_len(64)
