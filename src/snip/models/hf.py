"""Bridges to Hugging Face `transformers` Llama-family models (an optional dependency).

Three jobs:

- `tiny_hf_model(arch)` builds a small randomly initialized Llama, Qwen2, Mistral or GPT-2 model
  from a hand-written config, offline, so tests and examples can exercise quantization of real
  HF modules without downloading anything.  (GPT-2's projections are `Conv1D`, not `nn.Linear`:
  the case `snip.convert` must not miss.)
- `hf_linear_layers(model)` lists the decoder projections (q/k/v/o, gate/up/down; GPT-2's
  c_attn/c_proj/c_fc) that `snip.nn.convert` would quantize; `lm_head` is left out like our
  `output`.
- `from_hf_llama(hf_model)` copies a `LlamaForCausalLM` (or a Mistral model without sliding
  window) into our `Transformer`. The mapping is one to one because our RoPE pairs coordinates
  i and i + head_dim/2 exactly like HF's `rotate_half`, so no q/k row permutation is needed:

      model.embed_tokens                    -> tok_embeddings
      model.layers.i.self_attn.{q,k,v,o}_proj -> layers.i.attention.{wq,wk,wv,wo}
      model.layers.i.mlp.gate_proj / up_proj / down_proj -> layers.i.feed_forward.w1 / w3 / w2
      model.layers.i.input_layernorm        -> layers.i.attention_norm
      model.layers.i.post_attention_layernorm -> layers.i.ffn_norm
      model.norm / lm_head                  -> norm / output

The inverse, `to_hf_llama(model)` / `save_hf_llama(model, out)`, reads the same table backwards
and writes a `LlamaForCausalLM` directory (`config.json` + `model.safetensors`); it is what
`snip export RUN --format hf` runs on a checkpoint.

A Hugging Face model *directory* (``save_pretrained`` output: ``config.json`` plus
``model.safetensors`` or its sharded index) is read without `transformers` at all:
`hf_dir_config(dir)` is its `ModelConfig`, `hf_dir_state(dir)` its weights under our names. The
model name ``hf:DIR`` (`snip.models.get_config`) is that shape, so ``snip train --init-from-hf
DIR`` trains it and a later ``--resume`` rebuilds it (`snip.integrations.hf.init_from_hf`).

`transformers` is imported only inside the functions that build HF modules; without it they
raise an ImportError that says how to install it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace

import torch
import torch.nn as nn

from snip.errors import MissingFileError, UserError
from snip.models.configs import ModelConfig
from snip.models.llama import Transformer, build_model

HF_PREFIX = "hf:"  # model name prefix: "hf:DIR" is the shape of the HF model directory DIR
INSTALL_HINT = "pip install transformers"
HF_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
GPT2_PROJECTIONS = ("c_attn", "c_proj", "c_fc")
TINY_ARCHS = ("llama", "qwen2", "mistral", "gpt2")


@contextlib.contextmanager
def _quiet_imports() -> Iterator[None]:
    """Silence what importing transformers' model classes drags in from an installed torchao
    built for another torch or CUDA: "Failed to load ..._C*.so" (torchao's logger) and torch's
    ``register_constant() on Enum subclasses is deprecated`` (``torch.utils._pytree``);
    both are import-time noise, not errors of ours."""
    loggers = [logging.getLogger(n) for n in ("torchao", "torch.utils._pytree")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _transformers() -> ModuleType:
    try:
        with _quiet_imports():
            import transformers

            transformers.LlamaForCausalLM  # noqa: B018  (resolves the lazy imports, quietly)
    except ImportError as e:
        raise MissingDependencyError(
            f"this needs Hugging Face transformers, which is not installed: {INSTALL_HINT}"
        ) from e
    return transformers


class MissingDependencyError(UserError, ImportError):
    """An optional package is needed and absent (one line in the CLI, exit 2)."""


def tiny_hf_model(arch: str = "llama", seed: int = 0) -> nn.Module:
    """A small random `{Llama,Qwen2,Mistral}ForCausalLM` (hidden 64, 2 layers, 4 heads with
    2 KV heads, vocab 256) or `GPT2LMHeadModel` (same width, depth, heads and vocab), built
    offline; the global RNG state is left untouched."""
    if arch not in TINY_ARCHS:
        raise UserError(f"unknown arch {arch!r}; valid: {', '.join(TINY_ARCHS)}")
    tf = _transformers()
    shape = dict(
        vocab_size=256, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
    )
    if arch == "llama":
        config, cls = tf.LlamaConfig(**shape), tf.LlamaForCausalLM
    elif arch == "qwen2":  # Qwen2 has q/k/v biases; keep full attention, no sliding window
        config, cls = tf.Qwen2Config(**shape, use_sliding_window=False), tf.Qwen2ForCausalLM
    elif arch == "mistral":
        config, cls = tf.MistralConfig(**shape, sliding_window=None), tf.MistralForCausalLM
    else:
        config = tf.GPT2Config(vocab_size=256, n_positions=128, n_embd=64, n_layer=2, n_head=4,
                               bos_token_id=0, eos_token_id=0)
        cls = tf.GPT2LMHeadModel
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
    return model.eval()


def hf_linear_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) for every decoder projection of an HF Llama-family or GPT-2 model, in
    order (`nn.Linear`, or GPT-2's `Conv1D`)."""
    from snip.nn import is_linear_like

    names = HF_PROJECTIONS + GPT2_PROJECTIONS
    return [(name, m) for name, m in model.named_modules()
            if is_linear_like(m) and name.rsplit(".", 1)[-1] in names]


def _rope_theta(hf_config) -> float:
    # transformers >= 5 keeps RoPE settings in `rope_parameters`; 4.x used rope_theta/rope_scaling.
    params = getattr(hf_config, "rope_parameters", None) or getattr(
        hf_config, "rope_scaling", None
    ) or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise UserError(
            f"rope_type={rope_type!r} (RoPE scaling) is not supported by snip's Transformer; "
            "only the default RoPE converts exactly"
        )
    return float(params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0)))


def config_from_hf(hf_config) -> ModelConfig:
    """Our ModelConfig for an HF LlamaConfig (or MistralConfig without sliding window)."""
    kind = getattr(hf_config, "model_type", None)
    if kind not in ("llama", "mistral"):
        raise UserError(f"model_type {kind!r} cannot be converted; expected 'llama' or 'mistral'")
    for flag in ("attention_bias", "mlp_bias"):
        if getattr(hf_config, flag, False):
            raise UserError(f"{flag}=True is not supported: snip's projections have no bias")
    window = getattr(hf_config, "sliding_window", None)
    if window is not None and window < hf_config.max_position_embeddings:
        raise UserError(f"sliding_window={window} is not supported: snip uses full attention")
    cfg = ModelConfig(
        dim=hf_config.hidden_size,
        n_layers=hf_config.num_hidden_layers,
        n_heads=hf_config.num_attention_heads,
        n_kv_heads=hf_config.num_key_value_heads,
        vocab_size=hf_config.vocab_size,
        ffn_hidden=hf_config.intermediate_size,
        max_seq_len=hf_config.max_position_embeddings,
        norm_eps=hf_config.rms_norm_eps,
        rope_theta=_rope_theta(hf_config),
        tie_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
    )
    head_dim = getattr(hf_config, "head_dim", None)
    if head_dim is not None and head_dim != cfg.head_dim:
        raise UserError(f"head_dim={head_dim} != hidden_size / num_attention_heads")
    return cfg


_RENAMES = [  # (HF regex, our name), applied to each state-dict key
    (r"^model\.embed_tokens\.", "tok_embeddings."),
    (r"^model\.norm\.", "norm."),
    (r"^lm_head\.", "output."),
    (r"^model\.layers\.(\d+)\.self_attn\.q_proj\.", r"layers.\1.attention.wq."),
    (r"^model\.layers\.(\d+)\.self_attn\.k_proj\.", r"layers.\1.attention.wk."),
    (r"^model\.layers\.(\d+)\.self_attn\.v_proj\.", r"layers.\1.attention.wv."),
    (r"^model\.layers\.(\d+)\.self_attn\.o_proj\.", r"layers.\1.attention.wo."),
    (r"^model\.layers\.(\d+)\.mlp\.gate_proj\.", r"layers.\1.feed_forward.w1."),
    (r"^model\.layers\.(\d+)\.mlp\.up_proj\.", r"layers.\1.feed_forward.w3."),
    (r"^model\.layers\.(\d+)\.mlp\.down_proj\.", r"layers.\1.feed_forward.w2."),
    (r"^model\.layers\.(\d+)\.input_layernorm\.", r"layers.\1.attention_norm."),
    (r"^model\.layers\.(\d+)\.post_attention_layernorm\.", r"layers.\1.ffn_norm."),
]


def _rename(hf_key: str) -> str:
    for pattern, replacement in _RENAMES:
        key, n = re.subn(pattern, replacement, hf_key)
        if n:
            return key
    raise UserError(f"no snip name for Hugging Face parameter {hf_key!r}")


def from_hf_llama(hf_model: nn.Module) -> Transformer:
    """Our Transformer holding a copy of `hf_model`'s weights (same dtype, on the CPU)."""
    cfg = config_from_hf(hf_model.config)
    hf_state = hf_model.state_dict()
    dtype = next(iter(hf_state.values())).dtype
    model = build_model(cfg, dtype=dtype)
    state = {_rename(k): v for k, v in hf_state.items() if "rotary_emb" not in k}
    if cfg.tie_embeddings:  # HF may omit the tied head from its state dict
        state.setdefault("output.weight", state["tok_embeddings.weight"])
    model.load_state_dict(state, strict=True)
    return model.eval()


# --- snip -> Hugging Face (the inverse of from_hf_llama) --------------------------------------


def hf_config_from(cfg: ModelConfig, dtype: torch.dtype = torch.float32):
    """The `transformers.LlamaConfig` describing the same network as our `cfg`."""
    tf = _transformers()
    return tf.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.dim, intermediate_size=cfg.ffn_hidden,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm_eps,
        rope_theta=cfg.rope_theta, tie_word_embeddings=cfg.tie_embeddings,
        attention_bias=False, mlp_bias=False, hidden_act="silu", bos_token_id=None,
        eos_token_id=None, pad_token_id=None, dtype=str(dtype).removeprefix("torch."),
    )


def to_hf_llama(model: Transformer) -> nn.Module:
    """A `transformers.LlamaForCausalLM` holding a copy of our `model`'s weights.

    Quantized layers are plain linear layers as far as the weights go (a `QLinear` shares the
    `nn.Linear` Parameters), so a converted model exports its fp32 master weights.
    """
    tf = _transformers()
    state = model.state_dict()
    dtype = state["tok_embeddings.weight"].dtype
    with torch.device("meta"):
        hf = tf.LlamaForCausalLM(hf_config_from(model.config, dtype))
    hf = hf.to_empty(device="cpu").to(dtype)
    # invert the HF -> snip renaming on the HF model's own keys: one table, no second copy
    hf_name = {_rename(k): k for k in hf.state_dict() if "rotary_emb" not in k}
    unknown = [k for k in state if k not in hf_name]
    if unknown:
        raise UserError(f"no Hugging Face name for snip parameters {unknown[:3]}")
    hf_state = {hf_name[k]: v.detach().cpu() for k, v in state.items()}
    if model.config.tie_embeddings:
        hf_state.pop("lm_head.weight", None)
    missing, _ = hf.load_state_dict(hf_state, strict=False)
    missing = [k for k in missing if not (model.config.tie_embeddings and k == "lm_head.weight")]
    if missing:
        raise UserError(f"snip -> HF mapping incomplete: missing {missing[:3]}")
    if model.config.tie_embeddings:
        hf.tie_weights()
    hf.model.rotary_emb.__init__(hf.config)  # meta-initialised buffers: rebuild inv_freq
    return hf.eval()


def save_hf_llama(model: Transformer, out: str | Path) -> Path:
    """Write `model` as a Hugging Face Llama directory (`config.json`, `model.safetensors`,
    `generation_config.json`) that `transformers.AutoModelForCausalLM.from_pretrained` loads."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    to_hf_llama(model).save_pretrained(out, safe_serialization=True)
    umask = os.umask(0)
    os.umask(umask)
    for f in out.iterdir():  # safetensors writes its file 0600; give it the files' usual mode
        if f.is_file():
            f.chmod(0o666 & ~umask)
    return out


# --- Hugging Face model directories, read without transformers --------------------------------


def _dir_json(path: Path) -> dict:
    f = Path(path) / "config.json"
    if not f.is_file():
        raise MissingFileError(f"{path} is not a Hugging Face model directory (no config.json)")
    try:
        d = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{f} is not valid JSON: {e}") from None
    if not isinstance(d, dict):
        raise UserError(f"{f} must hold a JSON object")
    return d


def hf_dir_config(path: str | Path) -> ModelConfig:
    """Our ModelConfig for the Llama/Mistral model saved in ``path`` (its config.json)."""
    d = _dir_json(Path(path))
    d.setdefault("num_key_value_heads", d.get("num_attention_heads"))
    d.setdefault("rms_norm_eps", 1e-6)
    try:
        return config_from_hf(SimpleNamespace(**d))
    except AttributeError as e:
        raise UserError(f"{path}/config.json lacks a field snip needs: {e}") from None


def _weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / n for n in names]
    if (path / "model.safetensors").is_file():
        return [path / "model.safetensors"]
    if any(path.glob("*.bin")):
        raise UserError(f"{path} holds PyTorch .bin weights; snip reads safetensors: re-save "
                        "the model with save_pretrained(dir, safe_serialization=True)")
    raise MissingFileError(f"{path} has no model.safetensors (or its index)")


def hf_dir_state(path: str | Path) -> dict[str, torch.Tensor]:
    """The weights of the HF model directory ``path`` under our parameter names."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    cfg = hf_dir_config(path)
    state: dict[str, torch.Tensor] = {}
    for f in _weight_files(path):
        try:
            tensors = load_file(str(f))
        except (SafetensorError, OSError) as e:
            raise UserError(f"{f} is not a readable safetensors file ({e}); re-save or "
                            "re-download it") from None
        for k, v in tensors.items():
            if "rotary_emb" not in k:
                state[_rename(k)] = v
    if cfg.tie_embeddings:
        state.setdefault("output.weight", state["tok_embeddings.weight"])
    return state


def load_hf_dir(path: str | Path, model: Transformer) -> None:
    """Copy the weights of the HF directory ``path`` into ``model`` (same shape; a converted,
    quantized model too: its layers hold the same Parameters), in place."""
    state = hf_dir_state(path)
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    wrong = [k for k in state if k in own and state[k].shape != own[k].shape]
    if missing or unexpected or wrong:
        raise UserError(f"{path} does not fit the model being trained (missing {missing[:3]}, "
                        f"unexpected {unexpected[:3]}, other shapes {wrong[:3]})")
    with torch.no_grad():
        for k, v in state.items():
            own[k].copy_(v)
