"""How a gradient error becomes an update error: the linearised AdamW step.

AdamW at step ``t = s + 1`` (``s`` steps done) with gradient ``g``::

    m' = b1 m + (1 - b1) g          m_hat = m' / (1 - b1^t)
    v' = b2 v + (1 - b2) g^2        v_hat = v' / (1 - b2^t)
    u  = -lr m_hat / (sqrt(v_hat) + eps) - lr wd theta

Perturb ``g -> g + dg``.  To first order, element-wise, ``du = -a * dg`` with the *update gain*

    a = lr [ c1 / (sqrt(v_hat) + eps)  -  c2 m_hat g / (sqrt(v_hat) (sqrt(v_hat) + eps)^2) ]
    c1 = (1 - b1) / (1 - b1^t),   c2 = (1 - b2) / (1 - b2^t)

The first term is the momentum path through Adam's preconditioner; the second is the change of
the second moment (``dv = 2 (1 - b2) g dg``), which shrinks the update of coordinates whose
gradient grows.  Weight decay does not depend on ``g``.  Parameters without Adam state (or
another optimizer) fall back to ``a = lr`` (the SGD gain).

**Gradient noise in nats** (:func:`nats_weight`; our reconstruction, not the paper's).  A
GEMM kept quantized for many steps adds zero-mean noise of covariance ``Sigma_q`` to every
gradient.  For preconditioned SGD ``theta -= eta P g`` in a quadratic basin of Hessian ``H``, the
stationary parameter covariance solves ``eta (P H S + S H P) = eta^2 P Sigma P``; multiplying by
``P^-1`` and taking the trace gives ``tr(H S) = eta/2 tr(P Sigma)``, so the excess loss is

    E[L - L*] = 1/2 tr(H S) = eta/4 tr(P Sigma)          (independent of H)

Adam's momentum is heavy ball with ``eta (1 - b1)`` and ``b1``, whose effective rate is
``eta``; ``P = 1/(sqrt(v_hat) + eps)``.  So one unit of extra gradient variance on coordinate
``j`` costs ``omega_j = lr / (4 (sqrt(v_hat_j) + eps))`` nats of training loss at equilibrium --
the same unit as the loss divergence, with no Fisher or curvature estimate needed.
"""

from __future__ import annotations

import torch


def update_gain(optimizer: torch.optim.Optimizer | None, param: torch.Tensor,
                grad: torch.Tensor) -> torch.Tensor | float:
    """``a`` (same shape as ``param``) for one parameter, given this step's gradient."""
    if optimizer is None:
        return 1.0
    group = next((g for g in optimizer.param_groups if any(p is param for p in g["params"])),
                 None)
    if group is None:
        return 1.0
    lr = float(group["lr"])
    state = optimizer.state.get(param, {})
    if "exp_avg" not in state or "betas" not in group:
        return lr
    b1, b2 = group["betas"]
    eps = float(group.get("eps", 1e-8))
    t = float(state["step"]) + 1.0
    g = grad.float()
    m = b1 * state["exp_avg"].float() + (1 - b1) * g
    v = b2 * state["exp_avg_sq"].float() + (1 - b2) * g * g
    c1, c2 = (1 - b1) / (1 - b1**t), (1 - b2) / (1 - b2**t)
    m_hat, sv = m / (1 - b1**t), (v / (1 - b2**t)).sqrt()
    denom = sv + eps
    return lr * (c1 / denom - c2 * m_hat * g / (sv.clamp_min(eps) * denom * denom))


def adam_summary(optimizer: torch.optim.Optimizer | None, param: torch.Tensor) -> dict:
    """Frobenius norms of the moments plus step and lr, for the table's ``stats``."""
    if optimizer is None:
        return {}
    state = optimizer.state.get(param, {})
    group = next((g for g in optimizer.param_groups if any(p is param for p in g["params"])), {})
    out = {"lr": float(group.get("lr", float("nan")))}
    if "exp_avg" in state:
        out.update(m_norm=float(state["exp_avg"].float().norm()),
                   v_sqrt_mean=float(state["exp_avg_sq"].float().sqrt().mean()),
                   step=int(float(state["step"])))
    return out


def nats_weight(optimizer: torch.optim.Optimizer | None, param: torch.Tensor,
                grad: torch.Tensor) -> torch.Tensor | float:
    """``omega = lr / (4 (sqrt(v_hat) + eps))``: nats of stationary excess loss per unit of
    gradient-noise variance on each coordinate (module docstring).  Without Adam state the
    SGD value ``lr / 4``; without an optimizer ``1/4``."""
    if optimizer is None:
        return 0.25
    group = next((g for g in optimizer.param_groups if any(p is param for p in g["params"])),
                 None)
    if group is None:
        return 0.25
    lr = float(group["lr"])
    state = optimizer.state.get(param, {})
    if "exp_avg_sq" not in state or "betas" not in group:
        return lr / 4
    _, b2 = group["betas"]
    eps = float(group.get("eps", 1e-8))
    t = float(state["step"]) + 1.0
    g = grad.float()
    v_hat = (b2 * state["exp_avg_sq"].float() + (1 - b2) * g * g) / (1 - b2**t)
    return lr / (4 * (v_hat.sqrt() + eps))
