"""A run's memory, estimated before anything is built: refuse what cannot fit.

A model too large for the machine does not fail: it grows until the kernel's OOM killer ends
it (and maybe other processes), minutes later. So `Trainer` first adds up what one rank will
hold, from the model shape and the training settings alone::

    weights + gradients + AdamW moments    16 bytes per parameter (all fp32)
    emulation                              4 bytes per quantized weight (the dequantized copy
                                           the emulated GEMM multiplies by)
    saved activations                      per layer and token: the inputs of every linear
                                           layer, norms, RoPE q/k, the SwiGLU products
                                           (~14 dim + 3 ffn floats) plus the attention
                                           probabilities (n_heads x seq_len floats: the math
                                           kernel of scaled_dot_product_attention on CPU keeps
                                           them); logits and their gradient (3 vocab floats)

and compares it with the memory the device has free now (``MemAvailable`` on Linux, the free
CUDA memory). A run whose estimate exceeds it is refused with both numbers (exit 2);
``--train.force true`` starts it anyway. The estimate errs high for small models (allocator
overheads are not in it) and is meant to catch the orders-of-magnitude mistakes: a 7B model on
a laptop, ``seq_len 100000``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from snip.errors import UserError
from snip.models import ModelConfig
from snip.runtime import mem_available

GIB = 2**30


@dataclass(frozen=True)
class Estimate:
    params: int
    state_bytes: int  # weights, gradients, AdamW moments, emulation copies
    activation_bytes: int  # one micro-batch's saved activations (and logits)

    @property
    def total(self) -> int:
        return self.state_bytes + self.activation_bytes


def parameters(m: ModelConfig) -> tuple[int, int]:
    """(all parameters, those in linear layers of the blocks) of the model shape ``m``."""
    kv = m.dim * m.n_kv_heads // m.n_heads
    linear = m.n_layers * (2 * m.dim * m.dim + 2 * m.dim * kv + 3 * m.dim * m.ffn_hidden)
    head = 0 if m.tie_embeddings else m.vocab_size * m.dim
    total = linear + m.vocab_size * m.dim + head + (2 * m.n_layers + 1) * m.dim
    return total, linear + head


def estimate(m: ModelConfig, micro_batch: int, seq_len: int, world_size: int = 1,
             sharded: bool = False) -> Estimate:
    """What one rank holds while training ``m`` on micro-batches of ``micro_batch`` x
    ``seq_len`` tokens (``sharded``: FSDP divides the fp32 states by the world size)."""
    total, quantized = parameters(m)
    states = 16 * total // (world_size if sharded else 1) + 4 * quantized
    tokens = micro_batch * seq_len
    per_layer = tokens * (14 * m.dim + 3 * m.ffn_hidden + m.n_heads * seq_len)
    activations = 4 * (m.n_layers * per_layer + 3 * tokens * m.vocab_size)
    return Estimate(params=total, state_bytes=states, activation_bytes=activations)


def available(device: torch.device) -> int | None:
    """Bytes free on ``device`` now (None: unknown)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    return mem_available()


def check(m: ModelConfig, micro_batch: int, seq_len: int, device: torch.device, *,
          world_size: int = 1, sharded: bool = False, force: bool = False) -> Estimate:
    """The estimate; a `UserError` naming it and the free memory when it does not fit (unless
    ``force``)."""
    est = estimate(m, micro_batch, seq_len, world_size, sharded)
    free = available(device)
    if not force and free is not None and est.total > free:
        raise UserError(
            f"this run needs about {est.total / GIB:.1f} GiB on {device.type} "
            f"({est.params / 1e6:,.0f}M parameters: {est.state_bytes / GIB:.1f} GiB of "
            f"weights, gradients, AdamW and emulation state; "
            f"{est.activation_bytes / GIB:.1f} GiB of activations for {micro_batch} x "
            f"{seq_len} tokens), but only {free / GIB:.1f} GiB is free; use a smaller "
            "model.name, train.seq_len or per-step batch (train.grad_accum), or pass "
            "--train.force true to start anyway")
    return est
