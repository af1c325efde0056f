import json

import numpy as np
import pytest
import torch

import snip.data.corpus as corpus
from snip.data import (
    BPETokenizer,
    ByteTokenizer,
    TokenDataset,
    is_validation,
    iter_texts,
    load_bin,
    load_dataset,
    load_tokenizer,
    split_documents,
    stdlib_documents,
    text_documents,
    train_bpe,
)

# --- corpus listing and split ---------------------------------------------------------------


def test_stdlib_listing_is_sorted_and_excludes_tests():
    docs = stdlib_documents()
    rels = [d.relpath for d in docs]
    assert rels == sorted(rels) and len(rels) > 100
    assert "os.py" in rels and "json/decoder.py" in rels
    assert not any(p.split("/")[0] in ("site-packages", "test") for p in rels)
    assert not any("/tests/" in p or "/idle_test/" in p for p in rels)
    assert [d.relpath for d in stdlib_documents(max_files=5)] == rels[:5]


def test_split_is_stable_and_disjoint():
    docs = stdlib_documents()
    train, val = split_documents(docs, 0.05)
    assert {d.relpath for d in train}.isdisjoint(d.relpath for d in val)
    assert len(train) + len(val) == len(docs)
    assert 0.01 < len(val) / len(docs) < 0.1
    assert [d.relpath for d in split_documents(docs, 0.05)[1]] == [d.relpath for d in val]
    # Pinned: the split is sha1 of the path, never Python's per-process salted hash().
    pinned = [3, 5, 14, 20, 32, 38, 62, 83, 93, 94, 97, 101, 118, 124, 131, 151, 155, 159, 160,
              170, 186, 193, 194, 197]
    assert [i for i in range(200) if is_validation(f"m{i}.py", 0.1)] == pinned


def test_is_validation_monotone_in_fraction():
    paths = [f"pkg/mod{i}.py" for i in range(500)]
    small = {p for p in paths if is_validation(p, 0.05)}
    large = {p for p in paths if is_validation(p, 0.2)}
    assert small <= large  # raising the fraction only adds files to val
    assert not any(is_validation(p, 0.0) for p in paths)


# --- tokenizers -----------------------------------------------------------------------------


def test_byte_tokenizer_round_trip(tmp_path):
    tok = ByteTokenizer()
    text = "def f(x):\n    return 'héllo ✓'\n"
    ids = tok.encode(text)
    assert max(ids) < 256 and tok.decode(ids) == text
    assert np.array_equal(tok.encode_array(text), ids)
    tok.save(tmp_path / "t.json")
    assert isinstance(load_tokenizer(tmp_path / "t.json"), ByteTokenizer)
    assert isinstance(load_tokenizer("byte"), ByteTokenizer)


@pytest.fixture(scope="module")
def small_texts():
    docs = stdlib_documents()
    texts, total = [], 0
    for text in iter_texts(docs, "train"):
        texts.append(text)
        total += len(text)
        if total > 200_000:
            break
    return texts


def test_bpe_train_save_load_round_trip(small_texts, tmp_path):
    tok = train_bpe(small_texts, vocab_size=512)
    assert tok.vocab_size == 512 and tok.eot_id == 0
    sample = small_texts[0][:3000] + "\n# unicode: ✓ é 日本\n"
    ids = tok.encode(sample)
    assert tok.decode(ids) == sample
    assert len(ids) < 0.7 * len(sample.encode())  # merges shorten the sequence
    tok.save(tmp_path / "tokenizer.json")
    loaded = load_tokenizer(tmp_path / "tokenizer.json")
    assert isinstance(loaded, BPETokenizer) and loaded.encode(sample) == ids
    assert load_tokenizer(tok.to_dict()).encode(sample) == ids
    with pytest.raises(ValueError, match="vocab_size"):
        train_bpe(small_texts, vocab_size=100)


def test_a_hugging_face_tokenizer_json_with_its_end_of_text_at_any_id(small_texts, tmp_path):
    """A byte-level BPE trained with `tokenizers` itself, ``<|endoftext|>`` added last (GPT-2's
    layout), loads from its own tokenizer.json and separates documents with that id; one with
    no end-of-text token is refused in one line."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    from snip.data.corpus import Document, tokenize_documents
    from snip.data.tokenizer import save_hf_tokenizer
    from snip.errors import UserError

    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.train_from_iterator(small_texts, trainer=trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    hf.save(str(tmp_path / "plain.json"))
    with pytest.raises(UserError, match="no end-of-text token"):
        load_tokenizer(tmp_path / "plain.json")
    hf.add_special_tokens(["<|endoftext|>"])
    hf.save(str(tmp_path / "tokenizer.json"))
    tok = load_tokenizer(tmp_path / "tokenizer.json")
    assert tok.eot_id == tok.vocab_size - 1 == 400 and tok.decode(tok.encode("a = 1")) == "a = 1"
    docs = []
    for i, text in enumerate(("def f(): pass\n", "x = 2\n")):
        (tmp_path / f"d{i}.py").write_text(text)
        docs.append(Document(f"d{i}.py", tmp_path / f"d{i}.py"))
    stream = tokenize_documents(docs, tok)
    assert [i for i, t in enumerate(stream) if t == 400] == [len(tok.encode("def f(): pass\n")),
                                                             len(stream) - 1]
    (tmp_path / "hf").mkdir()
    save_hf_tokenizer(tok, tmp_path / "hf", 128)
    assert json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())["eos_token"] \
        == "<|endoftext|>"


def test_load_tokenizer_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json"):
        load_tokenizer(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text('{"type": "sentencepiece"}')
    with pytest.raises(ValueError, match="unknown tokenizer type"):
        load_tokenizer(tmp_path / "bad.json")


# --- user data ------------------------------------------------------------------------------


def test_bin_memmap_and_bad_size(tmp_path):
    tokens = np.arange(1000, dtype=np.uint16) % 700
    tokens.tofile(tmp_path / "data.bin")
    mm = load_bin(tmp_path / "data.bin")
    assert isinstance(mm, np.memmap) and np.array_equal(mm, tokens)
    ds = load_dataset(tmp_path / "data.bin", val_fraction=0.1, vocab_size=700)
    assert len(ds.train) == 900 and len(ds.val) == 100 and ds.vocab_size == 700
    (tmp_path / "odd.bin").write_bytes(b"\x00" * 7)
    with pytest.raises(ValueError, match="odd.bin has 7 bytes"):
        load_bin(tmp_path / "odd.bin")


def test_nanogpt_bin_dir(tmp_path):
    np.arange(300, dtype=np.uint16).tofile(tmp_path / "train.bin")
    np.arange(50, dtype=np.uint16).tofile(tmp_path / "val.bin")
    ds = load_dataset(tmp_path, vocab_size=1024)
    assert len(ds.train) == 300 and len(ds.val) == 50 and ds.vocab_size == 1024
    assert ds.tokenizer is None


def test_text_dir_loading(tmp_path):
    root = tmp_path / "texts"
    (root / "sub").mkdir(parents=True)
    files = {f"sub/f{i:02d}.txt": f"document {i}\n" * 50 for i in range(40)}
    for rel, text in files.items():
        (root / rel).write_text(text)
    (root / ".hidden.txt").write_text("secret")
    (root / "blob.dat").write_bytes(b"\x00\x01\x02")
    docs = text_documents(root)
    assert [d.relpath for d in docs] == sorted(files)
    ds = load_dataset(root, cache_dir=tmp_path / "cache")
    assert ds.vocab_size == 256 and ds.train.dtype == np.uint8
    n_text = sum(len(t) for t in files.values())
    assert len(ds.train) + len(ds.val) == n_text + len(files)  # one separator per document
    assert b"secret" not in bytes(ds.train) + bytes(ds.val)


def test_single_text_file_tail_split(tmp_path):
    (tmp_path / "a.txt").write_text("abcdefghij" * 100)
    ds = load_dataset(tmp_path / "a.txt", val_fraction=0.1, cache=False)
    assert len(ds.val) == 100 and bytes(ds.train[:10]) == b"abcdefghij"


def test_missing_and_empty_sources(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing_dir"):
        load_dataset(tmp_path / "missing_dir")
    with pytest.raises(FileNotFoundError, match="missing.bin"):
        load_dataset(tmp_path / "missing.bin")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no text files"):
        load_dataset(tmp_path / "empty")
    (tmp_path / "empty" / "a.txt").write_text("")
    with pytest.raises(ValueError, match="empty"):
        load_dataset(tmp_path / "empty", cache=False)
    (tmp_path / "z.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="z.bin is empty"):
        load_dataset(tmp_path / "z.bin")


# --- batches --------------------------------------------------------------------------------


def _dataset(seed=0) -> TokenDataset:
    rng = np.random.default_rng(0)
    stream = rng.integers(0, 256, 5000).astype(np.uint8)
    return TokenDataset(train=stream[:4500], val=stream[4500:], vocab_size=256, seed=seed)


def test_get_batch_shapes_and_determinism():
    ds = _dataset()
    x, y = ds.get_batch("train", 4, 32, step=7)
    assert x.shape == y.shape == (4, 32) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])  # y is x shifted by one token
    x2, y2 = _dataset().get_batch("train", 4, 32, step=7)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not torch.equal(x, ds.get_batch("train", 4, 32, step=8)[0])
    assert not torch.equal(x, _dataset(seed=1).get_batch("train", 4, 32, step=7)[0])
    assert not torch.equal(x, ds.get_batch("val", 4, 32, step=7)[0])


def test_rank_slices_union_equals_global_batch():
    ds = _dataset()
    for step in (0, 3, 1000):
        full_x, full_y = ds.get_batch("train", 6, 16, step)
        parts = [ds.get_batch("train", 3, 16, step, rank=r, world_size=2) for r in range(2)]
        assert torch.equal(torch.cat([p[0] for p in parts]), full_x)
        assert torch.equal(torch.cat([p[1] for p in parts]), full_y)


def test_get_batch_errors():
    ds = _dataset()
    with pytest.raises(ValueError, match="rank=2"):
        ds.get_batch("train", 2, 8, 0, rank=2, world_size=2)
    with pytest.raises(ValueError, match="split='test'"):
        ds.get_batch("test", 2, 8, 0)
    with pytest.raises(ValueError, match="too few for seq_len=600"):
        ds.get_batch("val", 2, 600, 0)


def test_iter_eval_batches_fixed_order():
    ds = _dataset()
    batches = list(ds.iter_eval_batches("val", batch_size=4, seq_len=50))
    assert len(batches) == 3  # 9 windows of 50 in 500 tokens -> 4 + 4 + 1
    assert batches[-1][0].shape == (1, 50)
    assert torch.equal(batches[0][0][0], torch.from_numpy(ds.val[:50].astype(np.int64)))
    assert torch.equal(batches[0][0][1], torch.from_numpy(ds.val[50:100].astype(np.int64)))
    again = list(ds.iter_eval_batches("val", batch_size=4, seq_len=50, max_batches=2))
    assert len(again) == 2
    assert all(torch.equal(a[0], b[0]) for a, b in zip(again, batches[:2], strict=True))
    shards = [list(ds.iter_eval_batches("val", 4, 50, rank=r, world_size=2)) for r in range(2)]
    assert [len(s) for s in shards] == [2, 1]
    assert torch.equal(shards[1][0][0], batches[1][0])


# --- built-in corpus and cache --------------------------------------------------------------


def test_stdlib_dataset_and_cache_reuse(tmp_path, monkeypatch):
    first = load_dataset(max_files=80, cache_dir=tmp_path)
    assert first.vocab_size == 256 and len(first.val) > 0 and len(first.train) > 100_000
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".npy", ".npy"]  # no temp leftovers

    def no_reading(path, *args, **kwargs):
        raise AssertionError(f"cache miss: read {path}")

    monkeypatch.setattr(corpus.stream, "text_pieces", no_reading)
    second = load_dataset(max_files=80, cache_dir=tmp_path)
    assert isinstance(second.train, np.memmap)
    assert np.array_equal(first.train, second.train) and np.array_equal(first.val, second.val)
    # A different corpus (or tokenizer) is a different cache entry, so it must read files.
    with pytest.raises(AssertionError, match="cache miss"):
        load_dataset(max_files=81, cache_dir=tmp_path)


def test_stdlib_dataset_separates_documents(tmp_path):
    ds = load_dataset(max_files=10, cache=False, val_fraction=0.0)
    assert len(ds.val) == 0
    assert int((np.asarray(ds.train) == 0).sum()) == 10  # one end-of-text byte per file
