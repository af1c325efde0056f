"""The estimators against ground truth: real quantized backward passes (Monte Carlo), the exact
Hessian diagonal, and the loss increase of a model whose loss is quadratic in each operand.

Tolerances: an estimate and its ground truth are two statistics (a few micro-batches vs a few
Monte Carlo draws), so each ``rel`` is a sampling bound, not float noise: it is several standard
errors of the draws.  Their seeds fix them on every machine; a last-bit difference in a GEMM moves
them by ~1e-6 relative.  Measured on an AVX2 EPYC, the largest used 18% of its tolerance (5.6x
margin; see issue 20's closing note)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from snip.formats import get_spec, quantize
from snip.models import build_model, get_config
from snip.nn import convert
from snip.plan import PrecisionPlan
from snip.sensitivity import Normalization, Propagation, SensitivityConfig, measure
from snip.sensitivity.adam import update_gain
from snip.sensitivity.estimate import hutchinson

FP4 = "fp4_e2m1_tile128"
FP32 = {"fprop": "fp32", "dgrad": "fp32", "wgrad": "fp32"}


def _batch(i: int = 0):
    g = torch.Generator().manual_seed(1000 + i)
    x = torch.randint(0, 256, (2, 32), generator=g)
    return x, torch.roll(x, -1, 1)


def _trained(n_layers: int):
    torch.manual_seed(0)
    m = build_model(get_config("tiny", n_layers=n_layers, max_seq_len=32))
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    for i in range(5):
        _, loss = m(*_batch(i + 1))
        loss.backward()
        opt.step()
        opt.zero_grad()
    return m, opt


@pytest.fixture(scope="module")
def trained():
    return _trained(1)


def _grads(model) -> list[torch.Tensor]:
    _, loss = model(*_batch())
    return [g.detach() for g in torch.autograd.grad(loss, list(model.parameters()))]


def _monte_carlo(model, opt, layer: str, gemm: str, draws: int) -> float:
    """E ||a * (g_quantized - g)||^2 over real stochastic-rounding backward passes in which
    only ``gemm`` of ``layer`` is FP4."""
    clean = _grads(model)
    gains = [update_gain(opt, p, g) for p, g in zip(model.parameters(), clean, strict=True)]
    q = convert(copy.deepcopy(model), PrecisionPlan(default=FP32,
                                                    layers={layer: {**FP32, gemm: FP4}}))
    total = 0.0
    for _ in range(draws):  # every forward advances the layer's rounding seed
        for a, g, c in zip(gains, _grads(q), clean, strict=True):
            total += float((a * a * (g - c) ** 2).sum())
    return total / draws


def _estimate(model, opt, propagation: Propagation, calib_batches: int):
    cfg = SensitivityConfig(candidates=(FP4,), calib_batches=calib_batches,
                            propagation=propagation, normalization=Normalization.SUM, seed=3)
    return measure(model, lambda i: _batch(), optimizer=opt, config=cfg)


MAIN = ["layers.0.attention.wv", "layers.0.attention.wo", "layers.0.feed_forward.w2"]


@pytest.mark.parametrize("gemm", ["dgrad", "wgrad"])
def test_weight_divergence_matches_real_quantized_backward(trained, gemm: str) -> None:
    """Per layer within 25% of the Monte Carlo average of real FP4 stochastic-rounding backward
    passes (the isotropic dgrad probe this replaced was off by 0.3x-2.4x)."""
    m, opt = trained
    table = _estimate(m, opt, Propagation.EXACT, calib_batches=4)
    for name in MAIN:
        truth = _monte_carlo(m, opt, name, gemm, draws=8)
        est = table.layers[name].metric(gemm, FP4).weight_div
        assert truth > 0
        assert est == pytest.approx(truth, rel=0.25), name


@pytest.mark.slow
@pytest.mark.parametrize("gemm", ["dgrad", "wgrad"])
def test_weight_divergence_every_layer_two_blocks(gemm: str) -> None:
    m, opt = _trained(2)
    table = _estimate(m, opt, Propagation.EXACT, calib_batches=8)
    for name, entry in table.layers.items():
        truth = _monte_carlo(m, opt, name, gemm, draws=32)
        assert entry.metric(gemm, FP4).weight_div == pytest.approx(truth, rel=0.25), name


def test_joint_propagation_agrees_with_exact(trained) -> None:
    """The one-pass estimate is unbiased; its cross-term noise is absolute (a share of the total),
    so layers that matter agree closely and negligible ones stay negligible."""
    m, opt = trained
    ex = _estimate(m, opt, Propagation.EXACT, calib_batches=4)
    jo = _estimate(m, opt, Propagation.JOINT, calib_batches=4)
    e = {n: v.metric("dgrad", FP4).weight_div for n, v in ex.layers.items()}
    j = {n: v.metric("dgrad", FP4).weight_div for n, v in jo.layers.items()}
    total = sum(e.values())
    for n in e:
        assert abs(j[n] - e[n]) <= 0.05 * total, n
        if e[n] >= 0.1 * total:
            assert j[n] == pytest.approx(e[n], rel=0.35), n


class _MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 5), nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))


def _mlp_loss(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


@pytest.mark.parametrize("samples,tol", [(200, 0.6),
                                         pytest.param(800, 0.35, marks=pytest.mark.slow)])
def test_hutchinson_matches_exact_hessian_diagonal(samples: int, tol: float) -> None:
    """All layers and inputs are perturbed at once (as in :func:`measure`), so off-diagonal and
    cross-layer terms add zero-mean noise that shrinks like 1/sqrt(samples)."""
    torch.manual_seed(0)
    model = _MLP()
    batch = (torch.randn(16, 6), torch.randint(0, 3, (16,)))
    est = hutchinson(model, batch, samples=samples, noise_scale=0.01, loss_fn=_mlp_loss)
    for name, lin in (("fc1", model.fc1), ("fc2", model.fc2)):
        w0 = lin.weight.detach().clone()

        def loss_of(w, name=name):
            out = torch.func.functional_call(model, {f"{name}.weight": w}, (batch[0],))
            return nn.functional.cross_entropy(out, batch[1])
        h = torch.autograd.functional.hessian(loss_of, w0).reshape(w0.numel(), -1).diagonal()
        got = est[name].w.reshape(-1)
        assert torch.linalg.norm(got - h) <= tol * torch.linalg.norm(h), name


class _Quad(nn.Module):
    """One linear layer; with the squared-error loss below the loss is quadratic in W and in X."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(128, 64, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


def _quad_loss(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return 0.5 * (model(x) - y).pow(2).sum(-1).mean()


def test_loss_divergence_matches_quadratic_model() -> None:
    """Under the error model (independent zero-mean errors with the format's magnitudes), the
    expected loss increase of a quadratic model is 1/2 sum E^2 diag(H): measured by evaluating
    the loss at operands perturbed by the real FP4 errors with random signs."""
    torch.manual_seed(0)
    model = _Quad()
    x, y = torch.randn(64, 128), torch.randn(64, 64)
    cfg = SensitivityConfig(candidates=(FP4,), calib_batches=8, noise_scale=0.01)
    table = measure(model, lambda i: (x, y), config=cfg, loss_fn=_quad_loss)
    spec = get_spec(FP4)
    ex = quantize(x, spec, axis=-1) - x
    w = model.proj.weight.detach().clone()
    ew = quantize(w, spec.for_weight(), axis=-1) - w
    gen = torch.Generator().manual_seed(1)
    base, total, draws = float(_quad_loss(model, (x, y)).detach()), 0.0, 200
    with torch.no_grad():
        for _ in range(draws):
            sx = torch.randint(0, 2, ex.shape, generator=gen) * 2 - 1
            sw = torch.randint(0, 2, ew.shape, generator=gen) * 2 - 1
            model.proj.weight.copy_(w + sw * ew)
            total += float(_quad_loss(model, (x + sx * ex, y))) - base
        model.proj.weight.copy_(w)
    measured = total / draws
    predicted = table.layers["proj"].metric("fprop", FP4).loss_div
    assert measured > 0
    assert predicted == pytest.approx(measured, rel=0.15)


def test_joint_propagation_on_bf16_weights(trained) -> None:
    """The forward difference (step 1e-3 of the parameter norm) still resolves bf16 weights:
    the direction moves every element differently, so rounding does not cancel it."""
    m, _ = trained

    def total(model) -> float:
        t = measure(model, lambda i: _batch(), config=SensitivityConfig(
            candidates=(FP4,), calib_batches=4, propagation=Propagation.JOINT,
            normalization=Normalization.SUM))
        return sum(e.metric("dgrad", FP4).weight_div for e in t.layers.values())

    assert total(copy.deepcopy(m).to(torch.bfloat16)) == pytest.approx(total(m), rel=0.35)
