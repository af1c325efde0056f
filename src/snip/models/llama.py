"""A Llama-style decoder-only transformer, all of it in this file.

The block is the one used by Llama 2/3, Mistral and Qwen2 (without biases):

    h = x + Attention(RMSNorm(x))        attention: RoPE on q and k, grouped-query, causal
    y = h + FeedForward(RMSNorm(h))      feed-forward: SwiGLU, w2(silu(w1 x) * w3 x)

- RMSNorm rescales each token vector to unit root-mean-square and multiplies by a learned gain
  (no mean subtraction, no bias). It is computed in fp32 because a sum of squares in bf16 loses
  the small components.
- RoPE (rotary position embedding) encodes position by rotating pairs of q/k coordinates by the
  angle pos * theta^(-2i/head_dim); a dot product of rotated vectors then depends only on the
  relative distance. We pair coordinate i with i + head_dim/2 ("rotate_half"), the layout of
  Hugging Face checkpoints, so their weights load without permuting rows. (Meta's original
  checkpoints pair adjacent coordinates 2i, 2i+1; converting those needs HF's row permutation.)
  The cos/sin tables are recomputed in fp32 on each forward: they cost T * head_dim / 2
  trigonometric evaluations, keep no buffers, and so never go stale under `.to(dtype)` or on the
  meta device.
- Grouped-query attention: `n_kv_heads` key/value heads, each repeated for `n_heads / n_kv_heads`
  query heads (query head h reads kv head h // group, as in HF's `repeat_kv`).

Every projection is a plain `nn.Linear` without bias, named as in Meta's reference code
(`layers.{i}.attention.wq`, `layers.{i}.feed_forward.w1`, ...), because `snip.nn.convert` swaps
`nn.Linear` modules for quantized `QLinear` ones by name and a precision plan addresses them by
the same names. The attention score and value products are not modules and stay in high
precision: they go through `F.scaled_dot_product_attention`.

Build models with `build_model(name_or_config, device=..., dtype=...)`. On `device="meta"` no
memory is allocated and no initialization runs, so a 70B model's structure is instant to inspect.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from snip.errors import UserError
from snip.models.configs import ModelConfig, get_config
from snip.nn import DEFAULT_SKIP_NAMES


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.type_as(x)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def rope_cos_sin(
    seq_len: int, head_dim: int, theta: float, device: torch.device | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotation angles, each (seq_len, head_dim), in fp32."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device).float(), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)  # coordinate i and i + head_dim/2 share an angle
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (x_i, x_{i+d/2}) by the angle of position t; x is (B, n_heads, T, head_dim)."""
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return (xf * cos + rotated * sin).type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        # (B, T, nh * hd) -> (B, nh, T, hd)
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        group = self.n_heads // self.n_kv_heads
        if group > 1:  # each kv head serves `group` consecutive query heads
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)
        return self.wo(y)


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_hidden, bias=False)  # gate
        self.w2 = nn.Linear(cfg.ffn_hidden, cfg.dim, bias=False)  # down
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_hidden, bias=False)  # up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        # Passing the (uninitialized) weight skips nn.Embedding's own normal_ init, which
        # init_weights redoes anyway and which on the meta device costs seconds of imports.
        emb = torch.empty(config.vocab_size, config.dim)
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim, _weight=emb)
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        if config.tie_embeddings:
            # One matrix both embeds tokens and scores them (Press & Wolf 2017); the module
            # stays an nn.Linear so the LM head can still be addressed and swapped by name.
            self.output.weight = self.tok_embeddings.weight
        self.init_weights()

    @torch.no_grad()
    def init_weights(self, std: float = 0.02, scale_residual: bool = True) -> None:
        """GPT-2 style: N(0, std) everywhere, norms at 1, and (with `scale_residual`) the two
        projections that write into the residual stream (wo, w2) at std / sqrt(2 * n_layers),
        so the stream's variance does not grow with depth. Uses the global torch RNG, in module
        order, so `torch.manual_seed` fixes the result. Skipped on the meta device."""
        if self.tok_embeddings.weight.is_meta:
            return
        residual_std = std / math.sqrt(2 * self.config.n_layers) if scale_residual else std
        nn.init.normal_(self.tok_embeddings.weight, mean=0.0, std=std)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear) and module.weight is not self.tok_embeddings.weight:
                is_residual = name.endswith(("attention.wo", "feed_forward.w2"))
                nn.init.normal_(module.weight, mean=0.0, std=residual_std if is_residual else std)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)

    def forward(
        self, tokens: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """tokens (B, T) int64 -> logits (B, T, vocab) and, given targets (B, T), the mean
        cross-entropy over positions whose target is not -1."""
        T = tokens.shape[1]
        if T > self.config.max_seq_len:
            raise UserError(
                f"sequence length {T} exceeds max_seq_len={self.config.max_seq_len}; "
                "use shorter sequences or a config with a larger max_seq_len"
            )
        cos, sin = rope_cos_sin(T, self.config.head_dim, self.config.rope_theta, tokens.device)
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, cos, sin)
        logits = self.output(self.norm(h))
        loss = None
        if targets is not None:
            # fp32 softmax: the log-sum-exp over a large vocabulary is where bf16 hurts.
            loss = F.cross_entropy(
                logits.float().flatten(0, 1), targets.flatten(), ignore_index=-1
            )
        return logits, loss

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameter count (a tied matrix counted once); `non_embedding` drops the token
        embedding, the usual convention in scaling-law tables."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.tok_embeddings.weight.numel()
        return n


def build_model(
    config_or_name: ModelConfig | str,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> Transformer:
    """A freshly initialized Transformer. On device="meta" no memory or init work is spent."""
    cfg = get_config(config_or_name) if isinstance(config_or_name, str) else config_or_name
    if not isinstance(cfg, ModelConfig):
        raise UserError(
            f"expected a ModelConfig or a config name, got {type(config_or_name).__name__}"
        )
    # Allocating on the target device directly avoids a CPU copy of large models.
    with torch.device(device if device is not None else "cpu"):
        model = Transformer(cfg)
    if dtype is not None:
        # Init in fp32 and cast afterwards, so a bf16 model is the rounded fp32 model.
        model = model.to(dtype)
    return model


def linear_layers(
    model: nn.Module, include_output: bool = False
) -> list[tuple[str, nn.Linear]]:
    """The quantizable projections, (name, module) in model order. The LM head (`output` or
    `lm_head`, as `snip.convert` skips it) is left out by default: it is usually kept in high
    precision (and may share the embedding)."""
    return [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear)
        and (include_output or name.rpartition(".")[2] not in DEFAULT_SKIP_NAMES)
    ]
