"""The dgrad term of weight divergence: an error-shaped probe, propagated upstream.

Quantizing layer ``l``'s dgrad GEMM (``dX = Q(G) Q(W)``, both along the output features)
perturbs the gradient that leaves the layer by exactly

    dX_q - dX = E^G Q(W) + G E^W,        E^G = Q(G) - G (stochastic rounding), E^W = Q(W) - W

and backpropagation, which is *linear* in the gradient once the forward activations are fixed,
carries it into every upstream parameter gradient: ``dg = J_l (dX_q - dX)`` with
``J_l = (d X_l / d theta)^T``.  The weight divergence is ``E ||omega^(1/2) * dg||^2`` for a
per-parameter weight ``omega`` (``a^2``, the squared Adam gain, or the nats weight of
:mod:`snip.sensitivity.adam`).  Over the stochastic rounding, ``E^G`` has independent zero-mean
elements, so (cross terms vanish, ``G E^W`` is deterministic for the fixed weight)

    E ||J (E^G Q(W) + G E^W)||^2_omega = E_s ||J ((s * E^G) Q(W) + G E^W)||^2_omega

for random signs ``s`` and one realisation of ``E^G`` (``E[(E^G)^2]`` is the per-element
variance).  That is the *error-shaped probe* ``p_l = (s * E^G) Q(W) + G E^W``: it has the real
error's covariance, where the old isotropic probe assumed every element of ``X_l`` had the same
error energy and the same upstream gain (off by 0.3x-2.4x per layer against real quantized
backward passes; RMSNorm's 1/rms and SwiGLU's gates are far from isotropic).

Two ways to evaluate ``e_l = ||J_l p_l||^2_omega``:

* ``exact`` -- one VJP per (layer, candidate): ``torch.autograd.grad(X_l, params, p_l)``.  Cost
  grows with depth x layers; for tests and validation.
* ``joint`` (default) -- every probe at once, with an independent random sign ``rho_{l,c}`` per
  layer and candidate and a scale ``lambda_c`` that equalises the candidates' energies::

      D = sum_{l,c} rho_{l,c} lambda_c J_l p_{l,c}                (one backward pass)
      e_{l,c} ~= rho_{l,c} / lambda_c * < p_{l,c}, J_l^T (omega * D) >

  ``E[rho_{l,c} < omega J_l p_{l,c}, D >] = lambda_c e_{l,c}`` because the cross terms have
  independent signs, and ``J_l^T v = (d X_l / d theta) v`` is a forward-mode derivative: the
  change of the layer inputs when the parameters move along ``v``, one finite-difference forward
  pass for all layers.  So the whole term costs one backward and one forward per ``omega``,
  independent of depth.  The cross terms add zero-mean noise of relative size about
  ``sqrt(sum_m e_m / (e_l d_eff))`` (``d_eff`` = effective dimension of the parameter space);
  averaging over micro-batches and cycles (the controller's EMA) shrinks it further.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Probe:
    """One layer's dgrad error probe for one candidate, injected at the layer's input."""

    layer: str
    candidate: str
    source: str             # first layer reading X_l (layers sharing X share the key)
    vector: torch.Tensor    # p_{l,c}, shape of X_l


@dataclass(frozen=True)
class Propagated:
    """``||J_l p_{l,c}||^2`` under each per-parameter weight (keys of ``weights``)."""

    energy: dict[str, float]


def random_signs(like: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Independent +-1 per element (drawn on the CPU generator, moved to ``like``'s device)."""
    s = torch.randint(0, 2, like.shape, generator=gen, device="cpu", dtype=torch.int8)
    return s.to(like.device, torch.float32) * 2 - 1


def shaped_probe(g2: torch.Tensor, eg: torch.Tensor, wq: torch.Tensor, ew: torch.Tensor,
                 signs: torch.Tensor) -> torch.Tensor:
    """``(s * E^G) Q(W) + G E^W`` for (tokens, out) gradients and (out, in) weights.

    One ``signs`` tensor may serve every candidate of a layer: each probe stays unbiased, and the
    joint estimator's per-(layer, candidate) sign ``rho`` still cancels the cross terms."""
    return (signs * eg) @ wq + g2 @ ew


def _weighted_energy(vjp: Sequence[torch.Tensor | None],
                     weights: Mapping[str, Sequence[torch.Tensor | float]]) -> dict[str, float]:
    return {k: sum(float((w * v.float() ** 2).sum()) for w, v in zip(ws, vjp, strict=True)
                   if v is not None) for k, ws in weights.items()}


Weights = Mapping[str, Sequence[torch.Tensor | float]]  # name -> one weight per parameter
Energies = dict[tuple[str, str], Propagated]              # (layer, candidate) -> energies


def exact(probes: Sequence[Probe], inputs: Mapping[str, torch.Tensor],
          params: list[nn.Parameter], weights: Weights) -> Energies:
    """One VJP per probe (slow, no cross terms): the reference for :func:`joint`."""
    out = {}
    for p in probes:
        x = inputs[p.source]
        if not x.requires_grad:
            out[(p.layer, p.candidate)] = Propagated(dict.fromkeys(weights, 0.0))
            continue
        vjp = torch.autograd.grad(x, params, grad_outputs=p.vector.reshape(x.shape).to(x.dtype),
                                  retain_graph=True, allow_unused=True)
        out[(p.layer, p.candidate)] = Propagated(_weighted_energy(vjp, weights))
    return out


InputsAt = Callable[[], Mapping[str, torch.Tensor]]


def _directional(inputs_at: InputsAt, params: list[nn.Parameter],
                 direction: list[torch.Tensor], rel_step: float,
                 x0: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``(d X / d theta) direction`` for every captured input, by a forward difference from
    the unperturbed inputs ``x0`` (one forward, shared by every direction)."""
    dnorm = sum(float(d.float().pow(2).sum()) for d in direction) ** 0.5
    pnorm = sum(float(p.detach().float().pow(2).sum()) for p in params) ** 0.5
    if dnorm == 0:
        return {}
    eps = rel_step * max(pnorm, 1e-12) / dnorm
    base = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p, d in zip(params, direction, strict=True):
            p.add_(d.to(p.dtype), alpha=eps)
        try:
            x1 = inputs_at()
        finally:
            for p, b in zip(params, base, strict=True):
                p.copy_(b)
    return {k: (x1[k].float() - x0[k]) / eps for k in x0}


def joint(probes: Sequence[Probe], inputs: Mapping[str, torch.Tensor],
          params: list[nn.Parameter], weights: Weights, inputs_at: InputsAt,
          gen: torch.Generator, rel_step: float = 1e-3) -> Energies:
    """All probes in one backward pass, attributed by one forward difference per weight.

    ``inputs_at()`` re-runs the forward (no grad) and returns the layer inputs keyed like
    ``inputs``; it is called with the parameters moved, so it must read them afresh.
    """
    live = [p for p in probes if inputs[p.source].requires_grad]
    by_cand: dict[str, float] = {}
    for p in live:
        by_cand[p.candidate] = by_cand.get(p.candidate, 0.0) + float(p.vector.pow(2).sum())
    top = max(by_cand.values(), default=0.0)
    lam = {c: (top / e) ** 0.5 if e > 0 else 1.0 for c, e in by_cand.items()}
    rho = (torch.randint(0, 2, (len(live),), generator=gen) * 2 - 1).tolist()
    total: dict[str, torch.Tensor] = {}
    for p, r in zip(live, rho, strict=True):
        v = (r * lam[p.candidate]) * p.vector
        total[p.source] = total[p.source] + v if p.source in total else v
    out = {(p.layer, p.candidate): Propagated(dict.fromkeys(weights, 0.0)) for p in probes}
    if not total:
        return out
    keys = list(total)
    d = torch.autograd.grad([inputs[k] for k in keys], params,
                            grad_outputs=[total[k].reshape(inputs[k].shape).to(inputs[k].dtype)
                                          for k in keys],
                            retain_graph=True, allow_unused=True)
    d = [torch.zeros_like(p) if g is None else g.float() for p, g in zip(params, d, strict=True)]
    energy: dict[tuple[str, str], dict[str, float]] = {k: {} for k in out}
    with torch.no_grad():
        x0 = {k: v.detach().float() for k, v in inputs_at().items()}
    for name, ws in weights.items():
        direction = [w * g for w, g in zip(ws, d, strict=True)]
        jt = _directional(inputs_at, params, direction, rel_step, x0)
        for p, r in zip(live, rho, strict=True):
            proj = jt.get(p.source)
            val = 0.0 if proj is None else \
                float((p.vector.reshape(-1) * proj.reshape(-1)).sum())
            energy[(p.layer, p.candidate)][name] = r * val / lam[p.candidate]
    for p in live:
        out[(p.layer, p.candidate)] = Propagated(energy[(p.layer, p.candidate)])
    return out
