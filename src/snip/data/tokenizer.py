"""Tokenizers: bytes by default, byte-level BPE when you want shorter sequences.

A tokenizer maps text to integer ids in [0, vocab_size) and back. Two are built in:

- `ByteTokenizer`: the UTF-8 bytes of the text, vocab 256. Nothing to train or store, every
  string round-trips, and the model's embedding and LM head stay tiny, which is why it is the
  default for the small models this project trains on a CPU. Byte 0 (NUL, absent from text
  files) doubles as the end-of-text separator between documents.
- `BPETokenizer`: byte-level BPE trained with the Hugging Face `tokenizers` library. Text is
  first mapped to bytes (so any string round-trips), then the most frequent adjacent pairs are
  merged until the vocabulary reaches `vocab_size`; id 0 is the special `<|endoftext|>` token.
  A Hugging Face ``tokenizer.json`` of any byte-level BPE loads too (GPT-2's, or one you trained
  with `tokenizers`): its documents are separated by its end-of-text token (the first of
  `EOT_TEXTS` it has, at whatever id), and ids are stored as uint16, so at most 65536 of them.
  For source code a 4096-entry vocabulary cuts sequence length about 3x against bytes. Train it
  on the training split only (`snip.data.corpus.iter_texts(split="train")`), so validation text
  never shapes the vocabulary, and keep its JSON in the run directory next to the checkpoints.

Anything with the `Tokenizer` protocol's attributes works with the rest of `snip.data`;
`load_tokenizer` turns a name, a JSON path or a `to_dict()` dict back into a tokenizer.

`save_hf_tokenizer(tok, out)` writes either one the way `transformers` loads it
(``tokenizer.json`` + ``tokenizer_config.json``: ``AutoTokenizer.from_pretrained(out)`` gives
the same ids). The byte tokenizer becomes a byte-level BPE with no merges whose vocabulary maps
GPT-2's printable stand-in for byte ``b`` to id ``b``: the ids are the UTF-8 bytes, as here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from snip import jsonfile
from snip.errors import MissingFileError, UserError

EOT_TEXT = "<|endoftext|>"
# end-of-text tokens a loaded tokenizer may use to separate documents, in order of preference
EOT_TEXTS = (EOT_TEXT, "<|end_of_text|>", "</s>", "<eos>")
MAX_VOCAB = 65536  # token ids are stored as uint16


@runtime_checkable
class Tokenizer(Protocol):
    name: str
    vocab_size: int
    eot_id: int  # separates documents in a token stream

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def to_dict(self) -> dict[str, Any]: ...

    def save(self, path: str | Path) -> None: ...


def _save_json(d: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(d), encoding="utf-8")


class ByteTokenizer:
    """UTF-8 bytes as tokens; invalid UTF-8 in `decode` becomes U+FFFD."""

    name = "byte"
    vocab_size = 256
    eot_id = 0

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_array(self, text: str) -> np.ndarray:
        """Same ids as `encode`, as uint8, without building a Python list per byte."""
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")

    def to_dict(self) -> dict[str, Any]:
        return {"type": "byte"}

    def save(self, path: str | Path) -> None:
        _save_json(self.to_dict(), path)

    def __repr__(self) -> str:
        return "ByteTokenizer()"


class BPETokenizer:
    """Byte-level BPE backed by a `tokenizers.Tokenizer`."""

    name = "bpe"

    def __init__(self, tokenizer: Any):
        self._tok = tokenizer
        self.vocab_size: int = tokenizer.get_vocab_size()
        if self.vocab_size > MAX_VOCAB:
            raise UserError(f"the tokenizer has {self.vocab_size} tokens; snip stores token ids "
                            f"as uint16, so at most {MAX_VOCAB}")
        found = [(t, i) for t in EOT_TEXTS if (i := tokenizer.token_to_id(t)) is not None]
        if not found:
            raise UserError(f"the tokenizer has no end-of-text token to separate documents "
                            f"(one of {', '.join(EOT_TEXTS)}); add one as a special token")
        self.eot_text, self.eot_id = found[0]

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = 4096) -> BPETokenizer:
        """Learn merges from `texts` until the vocabulary has `vocab_size` entries."""
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers, trainers

        # 256 byte symbols + the end-of-text token; ids are stored as uint16 on disk.
        if not 257 <= vocab_size <= MAX_VOCAB:
            raise UserError(f"vocab_size={vocab_size} must be in [257, {MAX_VOCAB}] for "
                            "byte-level BPE")
        tok = HFTokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[EOT_TEXT],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte, seen or not
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self.encode(text), dtype=np.uint16)

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def to_dict(self) -> dict[str, Any]:
        return {"type": "bpe", "tokenizer": json.loads(self._tok.to_str())}

    def save(self, path: str | Path) -> None:
        _save_json(self.to_dict(), path)

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size})"


def train_bpe(texts: Iterable[str], vocab_size: int = 4096) -> BPETokenizer:
    return BPETokenizer.train(texts, vocab_size)


def tokenizer_from_dict(d: dict[str, Any]) -> Tokenizer:
    kind = d.get("type")
    if kind == "byte":
        return ByteTokenizer()
    if kind == "bpe" or (kind is None and isinstance(d.get("model"), dict)):
        from tokenizers import Tokenizer as HFTokenizer

        # {"type": "bpe", "tokenizer": {...}} as `save` writes it, or a Hugging Face
        # tokenizers file (tokenizer.json: {"version", "model": {...}, ...}) itself
        body = d.get("tokenizer") if kind == "bpe" else d
        what = "a snip BPE tokenizer" if kind == "bpe" else "a Hugging Face tokenizer.json"
        if not isinstance(body, dict):
            raise UserError(f"{what} needs a 'tokenizer' object (the Hugging Face tokenizers "
                            "JSON); this one has none")
        try:
            backend = HFTokenizer.from_str(json.dumps(body))
        except Exception as e:  # tokenizers raises a bare Exception for a malformed body
            first = str(e).strip().splitlines()[0][:120] if str(e).strip() else ""
            raise UserError(f"{what} that the tokenizers library cannot read ({first})") from None
        return BPETokenizer(backend)
    raise UserError(f"unknown tokenizer type {kind!r}; expected 'byte' or 'bpe' (a snip "
                    "tokenizer saved with .save()) or a Hugging Face tokenizer.json")


def load_tokenizer(spec: str | Path | dict[str, Any] | Tokenizer = "byte") -> Tokenizer:
    """A tokenizer from "byte", a JSON file written by `save`, or a `to_dict()` dict."""
    if isinstance(spec, Tokenizer):
        return spec
    if isinstance(spec, dict):
        return tokenizer_from_dict(spec)
    if spec == "byte":
        return ByteTokenizer()
    path = Path(spec)
    if not path.is_file():
        raise MissingFileError(
            f"tokenizer {str(spec)!r} is neither 'byte' nor an existing JSON file; "
            "pass 'byte' or the path of a tokenizer saved with .save()"
        )
    return tokenizer_from_dict(jsonfile.read_object(path, "tokenizer file"))


# --- Hugging Face transformers layout ----------------------------------------------------------


def _byte_symbols() -> list[str]:
    """GPT-2's printable stand-in character for each byte (what ByteLevel pre-tokenizing maps
    byte ``b`` to), indexed by the byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1),
            *range(ord("\xae"), ord("\xff") + 1)]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b], extra = chr(256 + extra), extra + 1
    return [out[b] for b in range(256)]


def hf_backend(tok: Tokenizer) -> Any:
    """The `tokenizers.Tokenizer` that gives ``tok``'s ids (byte: a merge-free byte-level BPE)."""
    if isinstance(tok, BPETokenizer):
        return tok._tok
    if not isinstance(tok, ByteTokenizer):
        raise UserError(f"cannot write {tok!r} in the Hugging Face layout (byte or BPE only)")
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {c: b for b, c in enumerate(_byte_symbols())}
    backend = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return backend


def save_hf_tokenizer(tok: Tokenizer, out: str | Path, model_max_length: int) -> list[Path]:
    """``tokenizer.json`` and ``tokenizer_config.json`` in ``out`` for `transformers`
    (``AutoTokenizer.from_pretrained(out)`` encodes to ``tok``'s ids); returns the paths."""
    out = Path(out)
    files = [out / "tokenizer.json", out / "tokenizer_config.json"]
    hf_backend(tok).save(str(files[0]))
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast",
                              "model_max_length": model_max_length,
                              "clean_up_tokenization_spaces": False}
    if isinstance(tok, BPETokenizer):  # a real special token there, not a byte
        config["eos_token"] = tok.eot_text
    files[1].write_text(json.dumps(config, indent=1) + "\n")
    return files
