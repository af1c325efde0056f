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
