"""convert / unconvert / disabled / plan.apply on Llama-style models (ours and Hugging Face)."""

from __future__ import annotations

import zlib
from collections.abc import Mapping

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from snip.nn import (
    GEMM_NAMES,
    Accum,
    GemmSpecs,
    QLinear,
    SaveMode,
    bf16_gemms_idle,
    convert,
    disabled,
    layer_seed,
    plain_forward,
    qlinear_layers,
    saved_activation_bytes,
    unconvert,
)
from snip.nn.gemm import bf16_gemm_native
from snip.plan import PrecisionPlan

D, V = 32, 64


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.ModuleDict({p: nn.Linear(D, D, bias=False)
                                   for p in ("wq", "wk", "wv", "wo")})
        self.mlp = nn.ModuleDict({"w1": nn.Linear(D, 2 * D, bias=False),
                                  "w3": nn.Linear(D, 2 * D, bias=False),
                                  "w2": nn.Linear(2 * D, D, bias=False)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.attn
        q, k, v = a["wq"](x), a["wk"](x), a["wv"](x)
        att = torch.softmax(q @ k.transpose(-1, -2) / D**0.5, dim=-1)
        x = x + a["wo"](att @ v)
        m = self.mlp
        return x + m["w2"](F.silu(m["w1"](x)) * m["w3"](x))


class TinyLM(nn.Module):
    """Llama-shaped names: tok_embeddings, layers.N.attn.wq ..., layers.N.mlp.w1 ..., output."""

    def __init__(self, n_layers: int = 2) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.tok_embeddings = nn.Embedding(V, D)
        self.layers = nn.ModuleList(Block() for _ in range(n_layers))
        self.output = nn.Linear(D, V, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(idx)
        for layer in self.layers:
            x = layer(x)
        return self.output(x)


PROJ = [f"layers.{i}.{p}" for i in range(2)
        for p in ("attn.wq", "attn.wk", "attn.wv", "attn.wo", "mlp.w1", "mlp.w3", "mlp.w2")]


class Plan:
    """Stands in for snip.plan.PrecisionPlan: anything with resolve(model)."""

    def __init__(self, mapping: Mapping[str, GemmSpecs]) -> None:
        self.mapping = mapping

    def resolve(self, model: nn.Module) -> Mapping[str, GemmSpecs]:
        return self.mapping


def _tokens(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(seed))


def _loss(model: nn.Module, idx: torch.Tensor) -> torch.Tensor:
    logits = model(idx[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))


def test_convert_skips_head_and_embeddings_and_shares_parameters():
    model = TinyLM()
    params = dict(model.named_parameters())
    assert convert(model, "mxfp4") is model
    assert [n for n, _ in qlinear_layers(model)] == PROJ
    assert type(model.output) is nn.Linear and type(model.tok_embeddings) is nn.Embedding
    after = dict(model.named_parameters())
    assert params.keys() == after.keys() and all(params[k] is after[k] for k in params)
    assert all(m.seed == zlib.crc32(n.encode()) == layer_seed(n) for n, m in qlinear_layers(model))


def test_convert_accepts_spec_objects_and_filter():
    model = convert(TinyLM(), GemmSpecs(fprop="nvfp4", dgrad="fp8_e4m3", wgrad="fp8_e4m3"),
                    filter_fn=lambda mod, fqn: ".mlp." in fqn, save="encoded")
    layers = qlinear_layers(model)
    assert [n for n, _ in layers] == [n for n in PROJ if ".mlp." in n]
    assert all(m.specs.fprop.name == "nvfp4" and m.save.value == "encoded" for _, m in layers)


def test_convert_with_plan_converts_only_named_layers():
    mapping = {"layers.0.attn.wq": GemmSpecs.uniform("nvfp4"),
               "layers.1.mlp.w2": GemmSpecs(fprop="mxfp4", dgrad="bf16", wgrad="bf16")}
    model = convert(TinyLM(), Plan(mapping))
    assert {n: m.specs for n, m in qlinear_layers(model)} == mapping
    with pytest.raises(ValueError, match="layers.9.attn.wq"):
        convert(TinyLM(), Plan({"layers.9.attn.wq": GemmSpecs.uniform("nvfp4")}))


def test_convert_root_linear_returns_new_module():
    lin = nn.Linear(4, 4)
    q = convert(lin, "nvfp4")
    assert isinstance(q, QLinear) and q.weight is lin.weight


def test_unknown_preset_lists_valid_names():
    with pytest.raises(ValueError, match="valid presets: .*mxfp4"):
        convert(TinyLM(), "mxfp3")
    with pytest.raises(TypeError):
        convert(TinyLM(), 4)


def test_unconvert_restores_plain_linear_with_same_parameters():
    model = TinyLM()
    ref = model(_tokens())
    params = dict(model.named_parameters())
    unconvert(convert(model, "nvfp4"))
    assert not qlinear_layers(model)
    assert all(type(m) is nn.Linear for n, m in model.named_modules() if n in PROJ)
    assert all(params[k] is p for k, p in model.named_parameters())
    assert torch.equal(model(_tokens()), ref)


def test_disabled_is_fp32_and_restores_even_on_error():
    model = TinyLM()
    ref = model(_tokens())
    convert(model, "mxfp4")
    model.layers[0].attn["wq"].enabled = False  # a flag set by the user survives the block
    assert not torch.equal(model(_tokens()), ref)
    with disabled(model):
        assert torch.equal(model(_tokens()), ref)
    flags = [m.enabled for _, m in qlinear_layers(model)]
    assert flags == [False] + [True] * (len(PROJ) - 1)
    with pytest.raises(RuntimeError, match="boom"), disabled(model):
        raise RuntimeError("boom")
    assert [m.enabled for _, m in qlinear_layers(model)] == flags


def test_plain_forward_says_whether_the_forward_is_what_disabled_runs():
    model = TinyLM()
    assert plain_forward(model)  # no QLinear
    convert(model, "fp32")
    assert plain_forward(model)
    with torch.no_grad():
        out = model(_tokens())
        with disabled(model):
            assert torch.equal(out, model(_tokens()))  # bit for bit, as plain_forward says
    wq = model.layers[0].attn["wq"]
    wq.set_specs(GemmSpecs(fprop="fp32", dgrad="mxfp4", wgrad="mxfp4"))
    assert plain_forward(model)  # backward formats do not matter
    wq.set_specs("mxfp4")
    assert not plain_forward(model)
    wq.enabled = False  # a layer the user disabled runs F.linear
    assert plain_forward(model)
    wq.enabled = True
    wq.set_specs("fp32")
    wq.accum = Accum.BF16  # bf16 GEMMs: not F.linear's
    assert not plain_forward(model)
    wq.accum = Accum.AUTO  # bf16 GEMMs where they are native
    assert plain_forward(model) is not bf16_gemm_native("cpu")


def test_bf16_gemms_idle_says_whether_auto_would_run_quantized_gemms_in_bf16(monkeypatch):
    monkeypatch.setenv("SNIP_BF16_GEMM", "1")  # a machine that multiplies bf16 natively
    model = TinyLM()
    assert not bf16_gemms_idle(model)  # no QLinear
    convert(model, "fp32")
    assert not bf16_gemms_idle(model)  # nothing quantized: auto would only round fp32 to bf16
    wq = model.layers[0].attn["wq"]
    wq.set_specs(GemmSpecs(fprop="fp32", dgrad="fp32", wgrad="mxfp4"))
    assert bf16_gemms_idle(model)  # one quantized GEMM of one layer is enough
    wq.enabled = False
    assert not bf16_gemms_idle(model)
    wq.enabled = True
    for accum in (Accum.AUTO, Accum.BF16):  # its GEMMs run in bf16 already
        wq.accum = accum
        assert not bf16_gemms_idle(model)
    wq.accum = Accum.FP32
    monkeypatch.setenv("SNIP_BF16_GEMM", "0")  # bf16 not native: auto would run fp32 GEMMs
    assert not bf16_gemms_idle(model)


def _plan(layers: dict[str, str]) -> PrecisionPlan:
    """fp8_e4m3 everywhere but ``layers`` (name -> preset)."""
    return PrecisionPlan.from_dict({
        "version": 1, "default": dict.fromkeys(GEMM_NAMES, "fp8_e4m3"),
        "layers": {n: dict.fromkeys(GEMM_NAMES, p) for n, p in layers.items()}})


def test_plan_apply_keeps_parameters_and_optimizer_state():
    model = convert(TinyLM(), "fp8_e4m3")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    _loss(model, _tokens()).backward()
    opt.step()
    snapshot = {n: p.detach().clone() for n, p in model.named_parameters()}
    state = {id(p): {k: v.clone() for k, v in opt.state[p].items()} for p in model.parameters()}
    _plan({"layers.0.mlp.w1": "nvfp4", "layers.1.attn.wo": "mxfp4"}).apply(model)
    specs = {n: str(m.specs) for n, m in qlinear_layers(model)}
    assert specs["layers.0.mlp.w1"] == "nvfp4" and specs["layers.1.attn.wo"] == "mxfp4"
    assert specs["layers.0.attn.wq"] == "fp8_e4m3"
    assert all(torch.equal(p, snapshot[n]) for n, p in model.named_parameters())
    for p in model.parameters():
        assert all(torch.equal(v, state[id(p)][k]) for k, v in opt.state[p].items())
    _loss(model, _tokens()).backward()  # and it still trains
    opt.step()


def test_plan_apply_unknown_name_changes_nothing():
    model = convert(TinyLM(), "fp8_e4m3")
    with pytest.raises(ValueError, match="layers.0.attn.wz"):
        _plan({"layers.0.attn.wq": "nvfp4", "layers.0.attn.wz": "nvfp4"}).apply(model)
    assert all(str(m.specs) == "fp8_e4m3" for _, m in qlinear_layers(model))


def test_saved_activation_bytes_over_model():
    model = convert(TinyLM(), "mxfp4")
    _loss(model, _tokens()).backward()
    hp = saved_activation_bytes(model)
    convert(model, "mxfp4")  # already converted, no save given: each layer keeps its own
    assert all(m.save is SaveMode.HP for _, m in qlinear_layers(model))
    _loss(model, _tokens()).backward()
    assert saved_activation_bytes(model) == hp
    convert(model, "mxfp4", save="encoded")  # given: converted layers take it too
    assert all(m.save is SaveMode.ENCODED for _, m in qlinear_layers(model))
    _loss(model, _tokens()).backward()
    assert 0 < saved_activation_bytes(model) <= 0.35 * hp / 2  # vs bf16 = half of fp32


def test_reconverting_applies_accum_only_where_given():
    model = convert(TinyLM(), "fp32", accum="auto")
    convert(model, "mxfp4")  # not given: kept
    assert all(m.accum is Accum.AUTO and str(m.specs) == "mxfp4"
               for _, m in qlinear_layers(model))
    convert(model, "mxfp4", accum="bf16")  # given: applied to converted layers
    assert all(m.accum is Accum.BF16 for _, m in qlinear_layers(model))
    with pytest.raises(ValueError, match="accum"):  # bad input changes nothing
        convert(model, "nvfp4", accum="fp64")
    assert all(str(m.specs) == "mxfp4" for _, m in qlinear_layers(model))


def _hf_tiny_llama():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg)


def test_hf_tiny_llama_converts_and_trains_in_mxfp4():
    model = _hf_tiny_llama()
    convert(model, "mxfp4")
    names = [n for n, _ in qlinear_layers(model)]
    assert len(names) == 2 * 7 and "lm_head" not in names
    assert "model.layers.0.self_attn.q_proj" in names and "model.layers.1.mlp.down_proj" in names
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    idx = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    losses = []
    for _ in range(6):
        loss = model(input_ids=idx, labels=idx).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    print("\nHF tiny Llama mxfp4 losses:", [round(v, 3) for v in losses])
    assert losses[-1] < losses[0] - 0.2, losses


def test_hf_tiny_llama_nvfp4_under_autocast():
    model = convert(_hf_tiny_llama(), "nvfp4")
    idx = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=idx, labels=idx).loss
    loss.backward()
    grads = [p.grad for _, m in qlinear_layers(model) for p in m.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


# --- conversion never fails silently --------------------------------------------------------


def test_filter_fn_is_keyword_only_with_torchao_argument_order():
    seen = []

    def keep_mlp(module: nn.Module, fqn: str) -> bool:  # torchao's module_filter_fn order
        seen.append((type(module), fqn))
        return ".mlp." in fqn

    with pytest.raises(TypeError):
        convert(TinyLM(), "mxfp4", keep_mlp)  # positional filter_fn is refused
    model = convert(TinyLM(), "mxfp4", filter_fn=keep_mlp)
    assert seen[0] == (nn.Linear, "layers.0.attn.wq")
    skipped = {s.name: s.reason for s in model.snip_conversion.skipped}
    assert skipped["layers.0.attn.wq"] == "filter_fn" and skipped["output"] == "skip_names"


def test_convert_reports_and_logs_what_it_did(caplog):
    model = TinyLM()
    with caplog.at_level("INFO", logger="snip.nn.convert"):
        convert(model, "nvfp4")
    report = model.snip_conversion
    assert report.names == PROJ and {k for _, k in report.converted} == {"Linear"}
    assert [(s.name, s.reason) for s in report.skipped] == [("output", "skip_names")]
    assert "converted 14 layers (14 Linear)" in caplog.text and "output [Linear]" in caplog.text
    convert(model, "mxfp4")  # already converted: re-specified, still not "nothing"
    assert model.snip_conversion.updated == tuple(PROJ) and not model.snip_conversion.converted


def test_converting_nothing_is_an_error():
    with pytest.raises(ValueError, match="converted no layer of TinyLM.*output"):
        convert(TinyLM(), "nvfp4", filter_fn=lambda m, fqn: False)
    with pytest.raises(ValueError, match="converted no layer of Embedding.*0 linear-like"):
        convert(nn.Embedding(4, 4), "nvfp4")
    model = TinyLM()
    with pytest.raises(ValueError, match="converted no layer"):
        convert(model, Plan({}))
    assert not qlinear_layers(model)  # nothing was half-done


class MyLinear(nn.Module):
    """A linear-like module snip does not know."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(D, D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.T


def test_strict_rejects_unconverted_linear_like_modules():
    model = TinyLM()
    model.extra = MyLinear()
    model.mha = nn.MultiheadAttention(D, 2)
    convert(model, "nvfp4")  # lenient: converts what it can and records the rest
    reasons = {s.name: s.reason for s in model.snip_conversion.unsupported}
    assert set(reasons) == {"extra", "mha.out_proj"}
    assert "unsupported type" in reasons["extra"]
    assert "MultiheadAttention" in reasons["mha.out_proj"]
    assert type(model.mha.out_proj) is not QLinear
    with pytest.raises(ValueError, match=r"strict=True.*2 linear-like.*extra \[MyLinear\]"):
        convert(unconvert(model), "nvfp4", strict=True)
    assert not qlinear_layers(model)  # checked before anything changed
    convert(TinyLM(), "nvfp4", strict=True)  # the head skipped by skip_names is deliberate


def _hf_arch(arch: str) -> nn.Module:
    pytest.importorskip("transformers")
    from snip.models.hf import tiny_hf_model

    return tiny_hf_model(arch)


HF_EXPECTED = {"gpt2": (8, "Conv1D"), "llama": (14, "Linear"), "qwen2": (14, "Linear"),
               "mistral": (14, "Linear")}


@pytest.mark.parametrize("arch", sorted(HF_EXPECTED))
def test_hf_architectures_convert_exactly_and_train(arch):
    model = _hf_arch(arch)
    idx = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    keys = {k: v.shape for k, v in model.state_dict().items()}
    with torch.no_grad():
        ref = model(idx).logits
    convert(model, "fp32", strict=True)
    n, kind = HF_EXPECTED[arch]
    report = model.snip_conversion
    assert len(report.converted) == n and {k for _, k in report.converted} == {kind}
    assert [s.name for s in report.skipped] == ["lm_head"]
    assert {k: v.shape for k, v in model.state_dict().items()} == keys  # HF checkpoints still load
    with torch.no_grad():  # fp32 "quantization" is the identity: the same GEMMs as F.linear
        assert torch.equal(model(idx).logits, ref)  # (tests/nn/test_gemm.py), bit for bit
    convert(model, "nvfp4")
    with torch.no_grad():
        assert not torch.allclose(model(idx).logits, ref, atol=1e-3)  # and nvfp4 is not
    loss = model(input_ids=idx, labels=idx).loss
    loss.backward()
    assert all(m.weight.grad is not None and torch.isfinite(m.weight.grad).all()
               for _, m in qlinear_layers(model))
    unconvert(model)
    assert {type(m).__name__ for n_, m in model.named_modules()
            if n_.endswith(("c_attn", "q_proj"))} == {kind}


def test_gpt2_qconv1d_matches_qlinear_on_transposed_weight():
    from snip.nn import QConv1D

    gpt2 = _hf_arch("gpt2")
    conv = gpt2.transformer.h[0].mlp.c_fc
    q = QConv1D.from_conv1d(conv, "nvfp4", seed=3)
    lin = QLinear(q.in_features, q.out_features, specs="nvfp4", seed=3)
    with torch.no_grad():
        lin.weight.copy_(conv.weight.T)
        lin.bias.copy_(conv.bias)
    x = torch.randn(2, 5, q.in_features, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    y, y2 = q(x), lin(x2)
    assert torch.equal(y, y2)
    y.square().sum().backward()
    y2.square().sum().backward()
    assert q.weight is conv.weight and q.weight.shape == (q.in_features, q.out_features)
    assert torch.equal(conv.weight.grad, lin.weight.grad.T) and torch.equal(x.grad, x2.grad)


def test_gpt2_plan_names_conv1d_layers_and_costs_them():
    """A per-layer plan on an *unconverted* GPT-2 sees its Conv1D projections: resolve, convert
    and the cost model use (in, out) from the transposed weight."""
    from snip.plan import PrecisionPlan, fp4_flop_fraction

    model = _hf_arch("gpt2")
    mlp = [n for n, m in model.named_modules() if n.endswith(("mlp.c_fc", "mlp.c_proj"))]
    plan = PrecisionPlan(default={g: "bf16" for g in ("fprop", "dgrad", "wgrad")},
                         layers={"re:.*mlp\\.c_(fc|proj)": {g: "mxfp4" for g in
                                                            ("fprop", "dgrad", "wgrad")}})
    table = plan.resolve(model)
    assert len(table) == 8 and all(table[n].fprop.name == "mxfp4" for n in mlp)
    convert(model, plan, strict=True)
    assert len(model.snip_conversion.converted) == 8
    # c_fc and c_proj hold 2/3 of the blocks' linear FLOPs (4d^2 + 4d^2 of 3d^2 + d^2 + 8d^2)
    assert abs(fp4_flop_fraction(plan, model) - 8 / 12) < 1e-9


def test_a_layer_used_twice_is_converted_at_both_uses():
    """``named_modules`` lists a shared module once: both of its uses must become the one
    QLinear (the second stayed a plain fp32 nn.Linear, silently, strict or not)."""
    lin = nn.Linear(8, 8)
    seq = nn.Sequential(lin, nn.ReLU(), lin)
    convert(seq, "mxfp4", strict=True)
    assert isinstance(seq[0], QLinear) and seq[2] is seq[0]
    assert seq[0].weight is lin.weight
    unconvert(seq)
    assert type(seq[0]) is nn.Linear and seq[2] is seq[0] and seq[0].weight is lin.weight
    three = ("fprop", "dgrad", "wgrad")  # a plan names the layer by its first name
    plan = PrecisionPlan.from_dict({"version": 1, "default": dict.fromkeys(three, "bf16"),
                                    "layers": {"0": dict.fromkeys(three, "nvfp4")}})
    convert(seq, plan)
    assert seq[2] is seq[0] and seq[0].specs.fprop.name == "nvfp4"
