import math
import time

import pytest
import torch
import torch.nn as nn

from snip.models import (
    ModelConfig,
    Transformer,
    build_model,
    get_config,
    linear_layers,
    list_configs,
)


def _tiny(**overrides) -> Transformer:
    torch.manual_seed(0)
    return build_model(get_config("tiny", **overrides))


def test_forward_shapes_and_initial_loss():
    model = _tiny()
    tokens = torch.randint(0, 256, (3, 17))
    logits, loss = model(tokens)
    assert logits.shape == (3, 17, 256) and loss is None
    _, loss = model(tokens, targets=torch.randint(0, 256, (3, 17)))
    assert torch.isfinite(loss)
    # Near-uniform predictions at init: loss close to ln(vocab).
    assert abs(loss.item() - math.log(256)) < 0.1


def test_ignore_index_and_backward():
    model = _tiny()
    tokens = torch.randint(0, 256, (2, 8))
    targets = tokens.clone()
    targets[:, :4] = -1
    _, loss = model(tokens, targets)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_causal_mask():
    model = _tiny()
    tokens = torch.randint(0, 256, (1, 32))
    changed = tokens.clone()
    changed[0, 20:] = (changed[0, 20:] + 1) % 256
    with torch.no_grad():
        a, _ = model(tokens)
        b, _ = model(changed)
    # position i < 20 sees keys j <= i only: the changed keys enter as masked scores (exp -> 0,
    # a zero times a finite value added), so the same operations in the same order: bitwise
    assert torch.equal(a[:, :20], b[:, :20])
    assert not torch.allclose(a[:, 20:], b[:, 20:])


def test_gqa_shapes_and_mha_equivalence():
    model = _tiny(n_heads=4, n_kv_heads=2)
    attn = model.layers[0].attention
    assert attn.wq.out_features == 64 and attn.wk.out_features == 32
    # GQA equals MHA whose kv heads are the GQA ones repeated: copy weights and compare.
    mha = _tiny(n_heads=4, n_kv_heads=4)
    state = model.state_dict()
    for name, w in state.items():
        if name.endswith(("attention.wk.weight", "attention.wv.weight")):
            w = w.view(2, 16, 64).repeat_interleave(2, dim=0).reshape(64, 64)
        mha.state_dict()[name].copy_(w)
    tokens = torch.randint(0, 256, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens)[0], mha(tokens)[0])


def test_tied_embeddings_share_storage():
    model = _tiny(tie_embeddings=True)
    assert model.output.weight is model.tok_embeddings.weight
    untied = _tiny()
    assert model.num_params() == untied.num_params() - 256 * 64
    model(torch.randint(0, 256, (1, 4)), torch.randint(0, 256, (1, 4)))[1].backward()
    assert model.output.weight.grad is model.tok_embeddings.weight.grad


def test_init_is_deterministic_and_scaled():
    a, b = _tiny(), _tiny()
    for (n, p), q in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(p, q), n
    wq = a.layers[0].attention.wq.weight
    wo = a.layers[0].attention.wo.weight
    assert abs(wq.std().item() - 0.02) < 0.003
    assert abs(wo.std().item() - 0.02 / math.sqrt(4)) < 0.002
    assert torch.equal(a.norm.weight, torch.ones(64))


def test_module_names():
    model = _tiny()
    names = [n for n, _ in linear_layers(model)]
    assert names[:7] == [
        "layers.0.attention.wq", "layers.0.attention.wk", "layers.0.attention.wv",
        "layers.0.attention.wo", "layers.0.feed_forward.w1", "layers.0.feed_forward.w2",
        "layers.0.feed_forward.w3",
    ]
    assert len(names) == 14 and "output" not in names
    assert [n for n, _ in linear_layers(model, include_output=True)][-1] == "output"
    assert all(type(m) is nn.Linear and m.bias is None for _, m in linear_layers(model))
    for n in ("tok_embeddings", "norm", "layers.1.attention_norm", "layers.1.ffn_norm"):
        model.get_submodule(n)


def test_linear_layers_see_subclasses():
    class QLinear(nn.Linear):
        pass

    model = _tiny()
    old = model.layers[0].feed_forward.w1
    model.layers[0].feed_forward.w1 = QLinear(old.in_features, old.out_features, bias=False)
    assert any(isinstance(m, QLinear) for _, m in linear_layers(model))
    model(torch.randint(0, 256, (1, 4)))


def test_dtype_and_seq_len_limit():
    torch.manual_seed(0)
    model = build_model("tiny", dtype=torch.bfloat16)
    assert model.output.weight.dtype == torch.bfloat16
    logits, loss = model(torch.randint(0, 256, (1, 8)), torch.randint(0, 256, (1, 8)))
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    with pytest.raises(ValueError, match="max_seq_len"):
        model(torch.zeros(1, 129, dtype=torch.long))


def test_meta_build_70b_is_instant():
    build_model("tiny", device="meta")  # warm up lazy imports
    times = []
    for _ in range(2):  # best of two: the machine is shared
        t0 = time.perf_counter()
        model = build_model("llama2-70b", device="meta")
        times.append(time.perf_counter() - t0)
    assert min(times) < 1.0
    assert model.output.weight.is_meta
    assert model.num_params() == 68_976_648_192


# Published parameter counts (rounded) of each named size, and a loose band for ours.
_EXPECTED = {
    "tiny": (0.1e6, 0.2e6),
    "tiny-deep": (0.3e6, 0.4e6),
    "small": (0.7e6, 1.0e6),
    "small-deep": (1.5e6, 1.8e6),
    "medium": (6.0e6, 6.6e6),  # the "~6M-parameter width-256" size
    "tinyllama-1.1b": (1.09e9, 1.11e9),
    "llama2-7b": (6.7e9, 6.8e9),
    "llama2-70b": (68.9e9, 69.1e9),
    "llama3-8b": (8.0e9, 8.1e9),
    "llama3-70b": (70.5e9, 70.6e9),
}


@pytest.mark.parametrize("name", list_configs())
def test_named_config_param_counts(name):
    lo, hi = _EXPECTED[name]
    assert lo <= build_model(name, device="meta").num_params() <= hi


@pytest.mark.parametrize("name", ["small", "small-deep", "medium"])
def test_small_configs_are_tile_friendly(name):
    cfg = get_config(name)
    assert cfg.dim % 128 == 0 and cfg.ffn_hidden % 128 == 0
    assert (cfg.dim // cfg.n_heads * cfg.n_kv_heads) % 64 == 0


def test_larger_sizes_sit_between_small_and_tinyllama():
    names = list_configs()
    assert names.index("small") < names.index("small-deep") < names.index("medium") < \
        names.index("tinyllama-1.1b")
    assert get_config("small-deep").n_layers == 8 and get_config("medium").dim == 256


def test_get_config_errors_and_overrides():
    with pytest.raises(ValueError, match="valid names: tiny, tiny-deep, small"):
        get_config("llama9")
    with pytest.raises(ValueError, match="unknown ModelConfig field"):
        get_config("tiny", width=3)
    assert get_config("tiny", n_layers=3).n_layers == 3
    with pytest.raises(ValueError, match="unknown model config"):
        build_model("nope")


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(dim=100, n_heads=3), "dim=100 must be divisible by n_heads=3"),
        (dict(n_heads=4, n_kv_heads=3), "n_heads=4 must be divisible by n_kv_heads=3"),
        (dict(n_layers=0), "n_layers"),
        (dict(vocab_size=-1), "vocab_size"),
        (dict(dim=12, n_heads=4), "head_dim"),
        (dict(norm_eps=0.0), "norm_eps"),
        (dict(rope_theta=-1.0), "rope_theta"),
    ],
)
def test_bad_config(kwargs, field):
    base = dict(dim=64, n_layers=2, n_heads=4, vocab_size=256)
    with pytest.raises(ValueError, match=field):
        ModelConfig(**{**base, **kwargs})


def test_config_defaults_resolve():
    cfg = ModelConfig(dim=4096, n_layers=1, n_heads=32, vocab_size=10)
    assert cfg.n_kv_heads == 32
    assert cfg.ffn_hidden == 11008  # Meta's rule reproduces Llama 2 7B's width
    assert ModelConfig(**get_config("small").to_dict()) == get_config("small")
    with pytest.raises(TypeError):
        ModelConfig(4096, 1, 32, 10)  # keyword-only
    with pytest.raises(AttributeError):
        cfg.dim = 8  # frozen
