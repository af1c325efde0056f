import pytest
import torch

pytest.importorskip("transformers")

from snip.models import linear_layers  # noqa: E402
from snip.models.hf import (  # noqa: E402
    HF_PROJECTIONS,
    TINY_ARCHS,
    config_from_hf,
    from_hf_llama,
    hf_linear_layers,
    tiny_hf_model,
)


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_tiny_hf_models_build_offline(arch):
    model = tiny_hf_model(arch)
    layers = hf_linear_layers(model)
    if arch == "gpt2":  # c_attn, attn.c_proj, c_fc, mlp.c_proj per block
        assert len(layers) == 2 * 4 and layers[0][0] == "transformer.h.0.attn.c_attn"
    else:
        assert len(layers) == 2 * len(HF_PROJECTIONS)
        assert layers[0][0] == "model.layers.0.self_attn.q_proj"
    assert all("lm_head" not in name for name, _ in layers)
    with torch.no_grad():
        logits = model(torch.randint(0, 256, (1, 8))).logits
    assert logits.shape == (1, 8, 256)


def test_tiny_hf_model_is_seeded_and_leaves_rng_alone():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a, b = tiny_hf_model("llama", seed=1), tiny_hf_model("llama", seed=1)
    assert torch.rand(1) == before
    torch.testing.assert_close(a.lm_head.weight, b.lm_head.weight, rtol=0, atol=0)
    assert not torch.equal(a.lm_head.weight, tiny_hf_model("llama", seed=2).lm_head.weight)


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_from_hf_llama_logits_match(arch):
    hf = tiny_hf_model(arch)
    model = from_hf_llama(hf)
    assert len(linear_layers(model)) == len(hf_linear_layers(hf))
    tokens = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = hf(tokens).logits
        logits, _ = model(tokens)
    # two implementations of the same math (transformers' RMSNorm, rotary and attention vs
    # ours): other op orders, ~1e-6 on logits of size ~1 through 2 blocks on any CPU; 1e-4 is the
    # margin, far below a real mistake (a wrong rotary or norm moves logits by ~1e-1)
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-4)


def test_from_hf_llama_tied_and_theta():
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
        rope_theta=500000.0, tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    model = from_hf_llama(hf)
    assert model.config.tie_embeddings and model.config.rope_theta == 500000.0
    assert model.output.weight is model.tok_embeddings.weight
    tokens = torch.randint(0, 256, (1, 30))
    with torch.no_grad():
        # (the same two implementations as above, the same bound)
        torch.testing.assert_close(model(tokens)[0], hf(tokens).logits, rtol=0, atol=1e-4)


def test_unsupported_hf_models_raise():
    with pytest.raises(ValueError, match="model_type 'qwen2'"):
        from_hf_llama(tiny_hf_model("qwen2"))
    with pytest.raises(ValueError, match="unknown arch"):
        tiny_hf_model("gpt5")
    cfg = tiny_hf_model("llama").config
    cfg.mlp_bias = True
    with pytest.raises(ValueError, match="mlp_bias"):
        config_from_hf(cfg)
