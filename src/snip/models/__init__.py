"""Models: a Llama-style decoder with named sizes (`tiny` .. `llama3-70b`), and adapters for
Hugging Face Llama-family models (`snip.models.hf`, needs the optional `transformers`).

    from snip.models import build_model, linear_layers
    model = build_model("small")                   # random init, deterministic under manual_seed
    big = build_model("llama2-70b", device="meta")  # shapes only, no memory
    names = [name for name, _ in linear_layers(model)]  # what a precision plan can address
"""

from snip.models.configs import ModelConfig, get_config, list_configs
from snip.models.llama import (
    RMSNorm,
    Transformer,
    apply_rope,
    build_model,
    linear_layers,
    rope_cos_sin,
)

__all__ = [
    "ModelConfig",
    "RMSNorm",
    "Transformer",
    "apply_rope",
    "build_model",
    "get_config",
    "linear_layers",
    "list_configs",
    "rope_cos_sin",
]
