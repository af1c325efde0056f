"""Model shapes: the `ModelConfig` dataclass and the named sizes, from `tiny` to `llama3-70b`.

A Llama-style decoder is fully described by a handful of integers. The ones that need a word:

- `n_kv_heads`: grouped-query attention (GQA). The `n_heads` query heads are split into
  `n_kv_heads` groups that each share one key/value head, so the K and V projections are
  `n_heads / n_kv_heads` times narrower than Q. `n_kv_heads == n_heads` is plain multi-head
  attention, `n_kv_heads == 1` is multi-query attention.
- `ffn_hidden`: the width of the SwiGLU MLP. Meta's rule, used when it is left as None, is
  `int(2/3 * 4 * dim)`, optionally times `ffn_dim_multiplier`, rounded up to `multiple_of`; the
  published models were built with that rule and we write their resulting widths out explicitly.
- `rope_theta`: the base of the rotary position frequencies (10 000 for Llama 2, 500 000 for
  Llama 3, which stretches the longest wavelength for longer contexts).

The small sizes (`tiny`, `tiny-deep`, `small`, `small-deep`, `medium`) are for this project's own
training runs on a CPU or one GPU; any other shape trains from a named one with its fields
replaced (`get_config(name, dim=..., n_layers=...)`, or ``--model.dim`` ... in `snip train`).
`small` keeps the model's main widths at multiples of 128 (dim 128, ffn_hidden 384) because
SNIP's FP4/FP8 recipe quantizes in 1x128 and 128x128 tiles; its K/V projections are 64 wide
(4 heads of 32, 2 KV heads), which the block quantizers pad. The large sizes carry the real
published shapes so that the cost model, the planner and meta-device experiments see true layer
sizes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from snip.errors import UserError


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Shape of a Llama-style decoder. Validated on construction; fields are never mutated."""

    dim: int
    n_layers: int
    n_heads: int
    vocab_size: int
    n_kv_heads: int | None = None  # None: same as n_heads (no grouping)
    ffn_hidden: int | None = None  # None: Meta's rule from dim, ffn_dim_multiplier, multiple_of
    multiple_of: int = 256
    ffn_dim_multiplier: float | None = None
    max_seq_len: int = 2048
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        for name in ("dim", "n_layers", "n_heads", "vocab_size", "multiple_of", "max_seq_len"):
            _check_positive_int(name, getattr(self, name))
        # Resolve the two derived fields once, so every reader sees plain ints.
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        _check_positive_int("n_kv_heads", self.n_kv_heads)
        if self.ffn_hidden is None:
            object.__setattr__(self, "ffn_hidden", _meta_ffn_hidden(self))
        _check_positive_int("ffn_hidden", self.ffn_hidden)
        if self.dim % self.n_heads:
            raise UserError(f"dim={self.dim} must be divisible by n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise UserError(
                f"n_heads={self.n_heads} must be divisible by n_kv_heads={self.n_kv_heads} "
                "(each key/value head serves a whole group of query heads)"
            )
        if self.head_dim % 2:
            raise UserError(
                f"head_dim = dim / n_heads = {self.head_dim} must be even: RoPE rotates pairs"
            )
        if not self.norm_eps > 0:
            raise UserError(f"norm_eps={self.norm_eps} must be > 0")
        if not self.rope_theta > 0:
            raise UserError(f"rope_theta={self.rope_theta} must be > 0")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def to_dict(self) -> dict:
        """Field values, without the Nones (their defaults; TOML has no null), so that
        `ModelConfig(**cfg.to_dict()) == cfg`."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


def _check_positive_int(name: str, value: object) -> None:
    # bool is an int subclass; True as a layer count is a bug, not a 1.
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise UserError(f"{name}={value!r} must be a positive integer")


def _meta_ffn_hidden(cfg: ModelConfig) -> int:
    """SwiGLU has three matrices instead of two, so 2/3 of 4*dim keeps the parameter count."""
    hidden = int(2 * 4 * cfg.dim / 3)
    if cfg.ffn_dim_multiplier is not None:
        hidden = int(cfg.ffn_dim_multiplier * hidden)
    return cfg.multiple_of * ((hidden + cfg.multiple_of - 1) // cfg.multiple_of)


# Published shapes: Meta's params.json / the Hugging Face config.json of each model.
_CONFIGS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(
        dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=192, vocab_size=256,
        max_seq_len=128,
    ),
    # tiny's width, three times its depth: 42 linear layers, enough decision units for the
    # planner's choices (and SNIP's against a per-type rule) to differ
    "tiny-deep": ModelConfig(
        dim=64, n_layers=6, n_heads=4, n_kv_heads=2, ffn_hidden=192, vocab_size=256,
        max_seq_len=128,
    ),
    "small": ModelConfig(
        dim=128, n_layers=4, n_heads=4, n_kv_heads=2, ffn_hidden=384, vocab_size=256,
        max_seq_len=256,
    ),
    # small's width, twice its depth: 56 decision units, step cost about twice small's
    "small-deep": ModelConfig(
        dim=128, n_layers=8, n_heads=4, n_kv_heads=2, ffn_hidden=384, vocab_size=256,
        max_seq_len=256,
    ),
    # width 256, 8 blocks: 6.3M linear parameters (8 x 786k), 56 units, between small-deep
    # and tinyllama-1.1b; widths stay multiples of 128 (K/V: 4 KV heads of 32 = 128)
    "medium": ModelConfig(
        dim=256, n_layers=8, n_heads=8, n_kv_heads=4, ffn_hidden=768, vocab_size=256,
        max_seq_len=256,
    ),
    "tinyllama-1.1b": ModelConfig(
        dim=2048, n_layers=22, n_heads=32, n_kv_heads=4, ffn_hidden=5632, vocab_size=32000,
        max_seq_len=2048, rope_theta=10000.0,
    ),
    "llama2-7b": ModelConfig(
        dim=4096, n_layers=32, n_heads=32, n_kv_heads=32, ffn_hidden=11008, vocab_size=32000,
        max_seq_len=4096, rope_theta=10000.0,
    ),
    "llama2-70b": ModelConfig(
        dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_hidden=28672, vocab_size=32000,
        max_seq_len=4096, rope_theta=10000.0,
    ),
    "llama3-8b": ModelConfig(
        dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_hidden=14336, vocab_size=128256,
        max_seq_len=8192, rope_theta=500000.0,
    ),
    "llama3-70b": ModelConfig(
        dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_hidden=28672, vocab_size=128256,
        max_seq_len=8192, rope_theta=500000.0,
    ),
}


def list_configs() -> list[str]:
    """Names accepted by `get_config`, smallest first."""
    return list(_CONFIGS)


def get_config(name: str, **overrides: object) -> ModelConfig:
    """The named configuration, with any field replaced by a keyword (validated again);
    ``hf:DIR`` is the shape of the Hugging Face model directory DIR (`snip.models.hf`)."""
    if name.startswith("hf:"):
        from snip.models.hf import hf_dir_config

        return dataclasses.replace(hf_dir_config(name[3:]), **overrides)
    if name not in _CONFIGS:
        raise UserError(f"unknown model config {name!r}; valid names: {', '.join(_CONFIGS)}")
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise UserError(
            f"unknown ModelConfig field(s) {unknown}; valid fields: {', '.join(sorted(fields))}"
        )
    return dataclasses.replace(_CONFIGS[name], **overrides)
