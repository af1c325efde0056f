"""Data: the built-in corpus (Python's standard library), tokenizers, and token datasets whose
batches are a pure function of the step, so training resumes and shards exactly.

    from snip.data import load_dataset
    ds = load_dataset()                                  # stdlib sources, byte tokens, cached
    x, y = ds.get_batch("train", batch_size=16, seq_len=256, step=0)
    ds = load_dataset("my_texts/", tokenizer="runs/a/tokenizer.json")
    ds = load_dataset("data/openwebtext/")               # nanoGPT train.bin / val.bin
"""

from snip.data.corpus import (
    DEFAULT_VAL_FRACTION,
    Document,
    is_validation,
    iter_texts,
    split_documents,
    stdlib_documents,
    text_documents,
    tokenize_corpus,
)
from snip.data.dataset import TokenDataset, load_bin, load_dataset
from snip.data.tokenizer import (
    BPETokenizer,
    ByteTokenizer,
    Tokenizer,
    load_tokenizer,
    train_bpe,
)

__all__ = [
    "DEFAULT_VAL_FRACTION",
    "BPETokenizer",
    "ByteTokenizer",
    "Document",
    "TokenDataset",
    "Tokenizer",
    "is_validation",
    "iter_texts",
    "load_bin",
    "load_dataset",
    "load_tokenizer",
    "split_documents",
    "stdlib_documents",
    "text_documents",
    "tokenize_corpus",
    "train_bpe",
]
