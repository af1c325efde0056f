"""QLinear: shares nn.Linear's Parameters, counts steps, reports saved bytes, prints formats."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from snip.formats import get_spec
from snip.nn import Accum, GemmSpecs, QLinear, SaveMode, saved_activation_bytes


def _linear(seed: int = 0, k: int = 64, n: int = 32) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(k, n)


def test_from_linear_shares_parameters():
    lin = _linear()
    q = QLinear.from_linear(lin, "mxfp4", seed=5)
    assert q.weight is lin.weight and q.bias is lin.bias
    assert list(q.state_dict()) == list(lin.state_dict())
    back = q.to_linear()
    assert type(back) is nn.Linear and back.weight is lin.weight and back.bias is lin.bias


def test_from_linear_without_bias_and_training_flag():
    lin = nn.Linear(8, 4, bias=False).eval()
    q = QLinear.from_linear(lin, "fp32")
    assert q.bias is None and not q.training


def test_fp32_qlinear_equals_linear():
    lin = _linear()
    q = QLinear.from_linear(lin, "fp32")
    x = torch.randn(3, 5, 64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    q(x).sum().backward()
    w_grad, b_grad = lin.weight.grad.clone(), lin.bias.grad.clone()
    lin.zero_grad()
    lin(x2).sum().backward()
    assert torch.equal(x.grad, x2.grad)
    assert torch.equal(w_grad, lin.weight.grad) and torch.equal(b_grad, lin.bias.grad)


def test_step_counter_advances_and_changes_noise():
    q = QLinear.from_linear(_linear(), "mxfp4", seed=1)
    x = torch.randn(16, 64)
    grads = []
    for _ in range(2):
        xs = x.clone().requires_grad_()
        q(xs).square().sum().backward()
        grads.append(xs.grad)
    assert q.step == 2 and not torch.equal(grads[0], grads[1])
    q.step = 0  # rewinding the counter replays the same noise
    xs = x.clone().requires_grad_()
    q(xs).square().sum().backward()
    assert torch.equal(xs.grad, grads[0])


def test_enabled_false_is_plain_linear():
    lin = _linear()
    q = QLinear.from_linear(lin, "nvfp4")
    x = torch.randn(4, 64)
    q.enabled = False
    assert torch.equal(q(x), F.linear(x, lin.weight, lin.bias))
    q.enabled = True
    assert not torch.equal(q(x), F.linear(x, lin.weight, lin.bias))


def test_set_specs_switches_formats_only():
    q = QLinear.from_linear(_linear(), "fp32")
    w = q.weight
    q.set_specs(GemmSpecs(fprop="nvfp4", dgrad="mxfp8_e4m3", wgrad=get_spec("mxfp4")))
    assert q.specs.names() == {"fprop": "nvfp4", "dgrad": "mxfp8_e4m3", "wgrad": "mxfp4"}
    assert q.weight is w
    with pytest.raises(ValueError, match="valid presets"):
        q.set_specs("fp3")


def test_extra_repr_shows_the_three_formats():
    q = QLinear(64, 32, specs=GemmSpecs(fprop="nvfp4", dgrad="mxfp4", wgrad="fp8_e4m3"))
    assert "fprop=nvfp4, dgrad=mxfp4, wgrad=fp8_e4m3" in repr(q)
    assert "in_features=64" in repr(q) and "save" not in repr(q)
    q2 = QLinear(64, 32, specs="mxfp4", save="encoded", accum="bf16")
    assert "save=encoded" in repr(q2) and "accum=bf16" in repr(q2)


def test_saved_bytes_hp_vs_encoded():
    x = torch.randn(128, 64, requires_grad=True)
    sizes = {}
    for save in SaveMode:
        model = nn.Sequential(QLinear(64, 64, specs="mxfp4", save=save), nn.ReLU(),
                              QLinear(64, 64, specs="mxfp4", save=save))
        model(x).sum().backward()
        sizes[save] = saved_activation_bytes(model)
    assert sizes[SaveMode.HP] == 2 * 128 * 64 * 4  # fp32 X, both layers
    # FP4 codes (0.5 byte) + one e8m0 scale per 32 elements: 4.25 bits per element
    assert sizes[SaveMode.ENCODED] == 2 * 128 * 64 * 4.25 / 8


def test_autocast_forward_returns_bf16():
    q = QLinear(64, 32, specs="nvfp4")
    x = torch.randn(2, 8, 64, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = q(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32 and q.weight.grad.dtype == torch.float32


def test_bad_options_are_value_errors():
    with pytest.raises(ValueError):
        QLinear(4, 4, save="compressed")
    with pytest.raises(ValueError):
        QLinear(4, 4, accum="fp8")
    with pytest.raises(TypeError):
        QLinear(4, 4, specs=3)
    assert QLinear(4, 4, accum=Accum.BF16).accum is Accum.BF16


def test_step_counter_view_follows_the_tensor_through_copies_and_reassignment():
    """Eager forwards advance ``_step`` through a ctypes view kept by address: a deep copy, a
    pickle and a step tensor assigned anew each count on their own tensor, and a ``_step`` that
    is not a 0-d int64 CPU tensor still advances (through torch ops)."""
    import copy
    import pickle

    q = QLinear.from_linear(_linear(), "fp32")
    x = torch.randn(4, 64)
    q(x)
    q(x)
    assert q.step == 2 and int(q._step) == 2
    twin, clone = copy.deepcopy(q), pickle.loads(pickle.dumps(q))
    twin(x)
    clone(x)
    clone(x)
    assert (q.step, twin.step, clone.step) == (2, 3, 4)
    q.step = 10  # the setter writes the same tensor in place
    q(x)
    assert q.step == 11
    q._step = torch.tensor(5)  # a new tensor: a new view
    q(x)
    assert q.step == 6
    q._step = torch.tensor(5, dtype=torch.float64)  # not int64: no view (its bits differ)
    q(x)
    assert q._step.dtype == torch.float64 and q.step == 6


def test_layer_under_a_functorch_transform_still_goes_through_function_apply():
    """The layer calls the C ``apply`` directly only outside functorch transforms; inside one,
    ``Function.apply`` gives its own error (the Function has no ``setup_context``), even where
    no tensor of the call is wrapped."""
    q = QLinear.from_linear(_linear(), "mxfp4")
    x = torch.randn(2, 64)
    with pytest.raises(RuntimeError, match="setup_context"):
        torch.func.vmap(q)(torch.randn(3, 2, 64))

    def loss(w):
        return torch.func.functional_call(q, {"weight": w, "bias": q.bias}, (x,)).sum()
    with pytest.raises(RuntimeError, match="setup_context"):
        torch.func.grad(loss)(q.weight.detach())
    with pytest.raises(RuntimeError, match="setup_context"):  # active, though x is not wrapped
        torch.func.vmap(lambda z: q(x) * z)(torch.randn(3))
    leaked = []  # a tensor escaped from a transform: functorch's error, as through apply
    torch.func.vmap(lambda z: leaked.append(z) or z)(torch.randn(3, 2, 64))
    with pytest.raises(RuntimeError, match="escaped"):
        QLinear.from_linear(_linear(), "fp32")(leaked[0])


def test_alternating_tokens_reuse_their_configs_and_handles(monkeypatch):
    """Micro-batches alternate a layer's ``tokens``: each setting's ``GemmConfig`` and registry
    handle are made once and kept (at most ``_CONFIGS_KEPT``), the forward of each placement
    gives what a fresh layer with that placement gives, and a change of settings still makes a
    new config."""
    import snip.nn.qlinear as qlinear
    from snip.formats import RowShard

    made = []
    real = qlinear.GemmConfig
    monkeypatch.setattr(qlinear, "GemmConfig", lambda **k: made.append(k) or real(**k))
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    first, second = RowShard(0, 64), RowShard(32, 64)

    def run(layer: QLinear, tokens: RowShard) -> tuple[torch.Tensor, ...]:
        layer.tokens, layer.step = tokens, 3
        y = layer(x)
        y.backward(torch.ones_like(y))  # (SR gradients: the placement decides the coins)
        grads = (x.grad.clone(), layer.weight.grad.clone())
        x.grad = layer.weight.grad = layer.bias.grad = None
        return (y.detach(), *grads)

    q = QLinear.from_linear(_linear(), "mxfp4", seed=5)
    want = {t: run(q, t) for t in (first, second)}
    handles = {t: (setattr(q, "tokens", t), q._handle)[1] for t in (first, second)}
    n = len(made)
    for _ in range(3):
        for t in (first, second):
            assert all(torch.equal(a, b) for a, b in zip(run(q, t), want[t], strict=True))
            assert q._handle == handles[t]
    assert len(made) == n and handles[first] != handles[second]
    fresh = QLinear.from_linear(_linear(), "mxfp4", seed=5)
    assert all(torch.equal(a, b) for a, b in zip(run(fresh, second), want[second], strict=True))
    q.set_specs("nvfp4")
    assert q._config(torch.float32).specs == GemmSpecs.uniform("nvfp4")
    for i in range(qlinear._CONFIGS_KEPT + 1):
        q.tokens = RowShard(32 * i, 64 * qlinear._CONFIGS_KEPT)
        q._config(torch.float32)
    assert len(q._cfgs) <= qlinear._CONFIGS_KEPT
