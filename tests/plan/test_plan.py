"""PrecisionPlan: JSON schema and round trip, precedence, resolve, apply, diff, summary, errors.

Tolerances: every ``approx`` here compares float64 arithmetic on the same numbers summed in
another order (an ILP's objective against brute force's, a fraction of integer FLOPs, a JSON
round trip); Python floats round the same on every CPU, so ``rel=1e-9`` (or approx's default
1e-6) is millions of times wider than the ~n x 2^-53 such a sum can differ by."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from snip.formats import PRESETS
from snip.nn import QLinear
from snip.nn.specs import GemmSpecs
from snip.plan import PLAN_VERSION, PlanChange, PrecisionPlan, diff

FP4, FP8, BF16 = "fp4_e2m1_tile128", "fp8_e4m3_tile128", "bf16"
ATTN, FFN = ("wq", "wk", "wv", "wo"), ("w1", "w2", "w3")


def llama_stack(n_layers: int = 2, dim: int = 16, kv: int = 8, ffn: int = 32,
                vocab: int = 40, linear: type[nn.Linear] = nn.Linear) -> nn.Module:
    """Module tree named like snip.models' Llama: layers.<i>.attention.wq ..., output."""
    def block() -> nn.Module:
        shapes = {"wq": (dim, dim), "wk": (dim, kv), "wv": (dim, kv), "wo": (dim, dim)}
        attn = nn.ModuleDict({k: linear(i, o, bias=False) for k, (i, o) in shapes.items()})
        ff = nn.ModuleDict({"w1": linear(dim, ffn, bias=False), "w2": linear(ffn, dim, bias=False),
                            "w3": linear(dim, ffn, bias=False)})
        return nn.ModuleDict({"attention_norm": nn.LayerNorm(dim), "attention": attn,
                              "feed_forward": ff})
    return nn.ModuleDict({"tok_embeddings": nn.Embedding(vocab, dim),
                          "layers": nn.ModuleList(block() for _ in range(n_layers)),
                          "output": nn.Linear(dim, vocab, bias=False)})


def names(gemm: str = BF16, **kw: str) -> dict[str, str]:
    d = dict.fromkeys(("fprop", "dgrad", "wgrad"), gemm)
    d.update(kw)
    return d


def all_linear_names(n_layers: int = 2) -> list[str]:
    out = []
    for i in range(n_layers):
        out += [f"layers.{i}.attention.{w}" for w in ATTN]
        out += [f"layers.{i}.feed_forward.{w}" for w in FFN]
    return out


@pytest.fixture
def model() -> nn.Module:
    torch.manual_seed(0)
    return llama_stack()


@pytest.fixture
def plan() -> PrecisionPlan:
    return PrecisionPlan(
        default=names(FP8),
        layers={"layers.0.attention.wq": names(FP4, wgrad=FP8),
                r"re:layers\.[0-9]+\.feed_forward\.w2": names("nvfp4", wgrad="mxfp8_e4m3"),
                r"re:layers\.[0-9]+\.feed_forward\..*": names("mxfp4"),
                r"re:layers\.0\.feed_forward\.w1": names(BF16)},  # shadowed by the one above
        meta={"budget": {"fp4_flop_fraction": 0.75}, "step": 1200, "note": "ü"})


# --------------------------------------------------------------------------------------------
# JSON round trip
# --------------------------------------------------------------------------------------------

def test_json_round_trip_string_dict_and_file(plan, tmp_path):
    text = plan.to_json()
    assert json.loads(text)["version"] == PLAN_VERSION
    assert PrecisionPlan.from_json(text) == plan
    assert PrecisionPlan.from_json(json.loads(text)) == plan
    path = tmp_path / "plan.json"
    assert plan.to_json(path) == text
    again = PrecisionPlan.from_json(path)
    assert again == plan and again.to_json() == text
    assert PrecisionPlan.from_json(str(path)) == plan
    assert list(again.layers) == list(plan.layers)  # order kept: regex order is semantics
    assert again.meta == {"budget": {"fp4_flop_fraction": 0.75}, "step": 1200, "note": "ü"}


def test_design_doc_example_parses():
    text = r'''{"version": 1,
     "default": {"fprop": "bf16", "dgrad": "bf16", "wgrad": "bf16"},
     "layers": {"layers.0.attn.wq": {"fprop": "fp4_e2m1_tile128", "dgrad": "fp8_e4m3_tile128",
                                      "wgrad": "fp8_e4m3_tile128"},
                "re:layers\\.[0-9]+\\.mlp\\..*": {"fprop": "mxfp4", "dgrad": "mxfp4",
                                                  "wgrad": "mxfp8_e4m3"}},
     "meta": {"budget": {"fp4_flop_fraction": 0.75}, "step": 1200}}'''
    plan = PrecisionPlan.from_json(text)
    assert plan.layers["layers.0.attn.wq"]["fprop"] == FP4
    assert json.loads(plan.to_json()) == json.loads(text)


def test_uniform_and_from_table(model):
    assert PrecisionPlan.uniform("nvfp4").default == names("nvfp4")
    plan = PrecisionPlan.from_table(
        {"layers.0.attention.wq": GemmSpecs.uniform("mxfp4"),
         "layers.1.attention.wq": names(FP4, dgrad=FP8),
         "layers.1.feed_forward.w2": "NVFP4"},  # one preset for all three; case-insensitive
        default=FP8, meta={"source": "test"})
    table = plan.resolve(model)
    assert table["layers.0.attention.wq"] == GemmSpecs.uniform("mxfp4")
    assert table["layers.1.attention.wq"].names() == names(FP4, dgrad=FP8)
    assert table["layers.1.feed_forward.w2"] == GemmSpecs.uniform("nvfp4")
    assert table["layers.0.feed_forward.w1"] == GemmSpecs.uniform(FP8)
    assert PrecisionPlan.from_json(plan.to_json()) == plan
    assert plan.with_meta(step=3).meta == {"source": "test", "step": 3}


# --------------------------------------------------------------------------------------------
# Resolution and precedence
# --------------------------------------------------------------------------------------------

def test_resolve_covers_every_linear_but_the_head(model):
    table = PrecisionPlan.uniform(FP8).resolve(model)
    assert list(table) == all_linear_names()
    assert all(s == GemmSpecs.uniform(FP8) for s in table.values())


def test_precedence_exact_then_first_regex_then_default(model, plan):
    table = plan.resolve(model)
    assert table["layers.0.attention.wq"].names() == names(FP4, wgrad=FP8)        # exact
    assert table["layers.1.attention.wq"].names() == names(FP8)                    # default
    assert table["layers.0.feed_forward.w2"].names() == names("nvfp4", wgrad="mxfp8_e4m3")
    assert table["layers.1.feed_forward.w3"].names() == names("mxfp4")            # 2nd regex
    assert table["layers.0.feed_forward.w1"].names() == names("mxfp4")            # not 4th


def test_exact_name_beats_an_earlier_regex(model):
    plan = PrecisionPlan(default=names(), layers={
        "re:.*": names(FP8), "layers.1.attention.wk": names(FP4)})
    table = plan.resolve(model)
    assert table["layers.1.attention.wk"].names() == names(FP4)
    assert table["layers.0.attention.wk"].names() == names(FP8)


def test_regex_must_match_whole_name(model):
    plan = PrecisionPlan(default=names(), layers={"re:layers\\.0\\.attention\\.w": names(FP4)})
    with pytest.raises(ValueError, match="matches no linear layer"):
        plan.resolve(model)


def test_head_only_when_named_exactly(model):
    everything = PrecisionPlan(default=names(), layers={"re:.*": names(FP4)})
    assert "output" not in everything.resolve(model)
    table = PrecisionPlan(default=names(), layers={"output": names(FP8)}).resolve(model)
    assert list(table)[-1] == "output" and table["output"].names() == names(FP8)
    with pytest.raises(ValueError, match="never reach the LM head"):
        PrecisionPlan(default=names(), layers={"re:out.*": names(FP8)}).resolve(model)


def test_resolve_from_names_without_model():
    plan = PrecisionPlan(default=names(FP8), layers={"re:.*\\.w1": names(FP4)})
    table = plan.resolve(linear_names=["a.w1", "a.w2", "lm_head"])
    assert list(table) == ["a.w1", "a.w2"]
    assert table["a.w1"].names() == names(FP4)
    with pytest.raises(ValueError, match="model or linear_names"):
        plan.resolve()


def test_resolve_on_snip_models_llama():
    from snip.models import build_model

    model = build_model("llama2-70b", device="meta")
    plan = PrecisionPlan(default=names(FP8), layers={r"re:layers\.[0-9]+\.feed_forward\..*":
                                                     names(FP4)})
    table = plan.resolve(model)
    assert len(table) == 80 * 7 and "output" not in table


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------

def _doc(**over) -> dict:
    doc = {"version": 1, "default": names(), "layers": {"layers.0.attention.wq": names(FP4)}}
    doc.update(over)
    return doc


def test_unknown_preset_names_entry_and_lists_valid():
    doc = _doc(layers={"layers.0.attention.wq": names(FP4, dgrad="fp5_e2m2")})
    with pytest.raises(ValueError) as e:
        PrecisionPlan.from_json(doc)
    msg = str(e.value)
    assert "'layers.0.attention.wq'" in msg and "dgrad" in msg and "'fp5_e2m2'" in msg
    assert all(p in msg for p in PRESETS)


def test_missing_and_unknown_gemm_keys():
    entry = {"fprop": FP4, "wgrad": FP4}
    with pytest.raises(ValueError, match=r"'layers\.0\.attention\.wq' is missing GEMM key 'dgrad'"):
        PrecisionPlan.from_json(_doc(layers={"layers.0.attention.wq": entry}))
    with pytest.raises(ValueError, match="'default' is missing GEMM key 'fprop'"):
        PrecisionPlan.from_json(_doc(default={"dgrad": BF16, "wgrad": BF16}))
    with pytest.raises(ValueError, match="unknown key 'fporp'"):
        PrecisionPlan.from_json(_doc(default={**names(), "fporp": BF16}))
    with pytest.raises(ValueError, match="must be an object"):  # files need the full object
        PrecisionPlan.from_json(_doc(layers={"layers.0.attention.wq": FP4}))


@pytest.mark.parametrize("version", [2, 0, "1", True, None])
def test_wrong_or_missing_version(version):
    doc = _doc(version=version) if version is not None else {k: v for k, v in _doc().items()
                                                             if k != "version"}
    with pytest.raises(ValueError, match='reads "version": 1'):
        PrecisionPlan.from_json(doc)


def test_structural_errors():
    with pytest.raises(ValueError, match="unknown plan key 'layer'"):
        PrecisionPlan.from_json({**_doc(), "layer": {}})
    with pytest.raises(ValueError, match='no "default"'):
        PrecisionPlan.from_json({"version": 1, "layers": {}})
    with pytest.raises(ValueError, match="not a valid regex"):
        PrecisionPlan(default=names(), layers={"re:layers.(": names()})
    with pytest.raises(ValueError, match="JSON-serializable"):
        PrecisionPlan(default=names(), meta={"x": object()})
    with pytest.raises(ValueError, match="not a preset"):
        custom = PRESETS["mxfp4"].__class__(name="mine", element="e2m1", block=32,
                                            scaling=PRESETS["mxfp4"].scaling)
        PrecisionPlan.uniform(custom)


def test_invalid_json_file_reports_line_and_column(tmp_path):
    path = tmp_path / "bad_plan.json"
    path.write_text('{"version": 1,\n "default": {"fprop": "bf16",,}\n}')
    with pytest.raises(ValueError, match=r"bad_plan\.json is not valid JSON: line 2, column 30"):
        PrecisionPlan.from_json(path)
    with pytest.raises(ValueError, match="plan JSON string is not valid JSON: line 1"):
        PrecisionPlan.from_json('{"version": 1,')


def test_a_key_twice_or_a_list_is_refused(tmp_path):
    """JSON parsers keep the last of two equal keys: a hand-edited plan lost a layer's
    entry silently. JSON text that is a list was taken for a file name."""
    def three(fprop: str) -> str:
        return json.dumps({"fprop": fprop, "dgrad": "bf16", "wgrad": "bf16"})

    text = (f'{{"version": 1, "default": {three("bf16")}, "layers": '
            f'{{"a.wq": {three("nvfp4")}, "a.wq": {three("bf16")}}}}}')
    (tmp_path / "p.json").write_text(text)
    for source in (text, tmp_path / "p.json"):
        with pytest.raises(ValueError, match="has the key 'a.wq' twice"):
            PrecisionPlan.from_json(source)
    with pytest.raises(ValueError, match="a plan must be a JSON object, got list"):
        PrecisionPlan.from_json('[{"version": 1}]')


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json"):
        PrecisionPlan.from_json(tmp_path / "nope.json")


def test_unmatched_name_suggests_close_names(model):
    plan = PrecisionPlan(default=names(), layers={"layers.0.attention.wqq": names(FP4)})
    with pytest.raises(ValueError, match=r"'layers\.0\.attention\.wqq'.*did you mean "
                                         r"'layers\.0\.attention\.wq'"):
        plan.resolve(model)


def test_unmatched_regex_is_an_error(model):
    plan = PrecisionPlan(default=names(), layers={r"re:layers\.[0-9]+\.mlp\..*": names(FP4)})
    with pytest.raises(ValueError) as e:
        plan.resolve(model)
    assert r"plan entry 're:layers\.[0-9]+\.mlp\..*': regex matches no linear layer" in str(e.value)


def test_non_linear_module_name_is_explained(model):
    plan = PrecisionPlan(default=names(), layers={"layers.0.attention": names(FP4)})
    with pytest.raises(ValueError, match="names a ModuleDict, not a linear layer"):
        plan.resolve(model)


# --------------------------------------------------------------------------------------------
# apply
# --------------------------------------------------------------------------------------------

def test_apply_switches_specs_and_keeps_weights(plan):
    model = llama_stack(linear=QLinear)
    weights = {n: p for n, p in model.named_parameters()}
    values = {n: p.detach().clone() for n, p in weights.items()}
    applied = plan.apply(model)
    assert applied == plan.resolve(model)
    for name, specs in applied.items():
        assert model.get_submodule(name).specs == specs
    after = PrecisionPlan.uniform("mxfp4").apply(model)
    assert model.get_submodule("layers.0.attention.wq").specs == GemmSpecs.uniform("mxfp4")
    assert list(after) == all_linear_names()
    for n, p in model.named_parameters():
        assert p is weights[n] and torch.equal(p, values[n])


def test_apply_needs_a_converted_model(model, plan):
    with pytest.raises(ValueError, match=r"snip\.convert"):
        plan.apply(model)


def test_apply_with_snip_nn_convert(plan):
    from snip.nn import convert

    model = convert(llama_stack(), PrecisionPlan.uniform(FP8))
    assert plan.apply(model) == plan.resolve(model)


# --------------------------------------------------------------------------------------------
# diff and summary
# --------------------------------------------------------------------------------------------

def test_diff_raw_entries():
    a = PrecisionPlan(default=names(FP8), layers={"x.wq": names(FP4)})
    b = PrecisionPlan(default=names(FP8, wgrad=BF16), layers={"x.wq": names(FP4, dgrad=FP8),
                                                               "x.wk": names(FP4)})
    assert diff(a, b) == [
        PlanChange("default", "wgrad", FP8, BF16),
        PlanChange("x.wq", "dgrad", FP4, FP8),
        PlanChange("x.wk", "fprop", None, FP4),
        PlanChange("x.wk", "dgrad", None, FP4),
        PlanChange("x.wk", "wgrad", None, FP4),
    ]
    assert a.diff(a) == []


def test_diff_resolved_tables(model):
    a = PrecisionPlan.uniform(FP8)
    b = PrecisionPlan(default=names(FP8), layers={
        "layers.1.feed_forward.w2": names(FP4, wgrad=FP8), "output": names(BF16)})
    assert a.diff(b, model) == [
        PlanChange("layers.1.feed_forward.w2", "fprop", FP8, FP4),
        PlanChange("layers.1.feed_forward.w2", "dgrad", FP8, FP4),
        PlanChange("output", "fprop", None, BF16),
        PlanChange("output", "dgrad", None, BF16),
        PlanChange("output", "wgrad", None, BF16),
    ]
    # Raw entries differ (a regex vs. the same thing spelt out) but the resolved tables agree.
    c = PrecisionPlan(default=names(FP8), layers={"re:.*": names(FP8)})
    assert diff(a, c) and not diff(a, c, model)


def test_summary_lists_every_layer_with_fp4_fraction(model):
    plan = PrecisionPlan(default=names(FP8), layers={r"re:layers\.0\..*": names(FP4)})
    text = plan.summary(model, tokens=8, profile="blackwell")
    for name in all_linear_names():
        assert name in text
    assert "FP4 FLOP fraction 50.0%" in text
    assert "relative GEMM time" in text and "blackwell" in text
    shares = [float(line.split()[-1]) for line in text.splitlines() if line.startswith("layers.")]
    assert sum(shares) == pytest.approx(100, abs=0.05)
