"""Write-back policies: how an optimizer's fp32 result becomes the stored low-precision weight.

Each optimizer step proposes an increment ``d`` for a stored weight ``q`` (for AdamW,
``d = -lr * (m_hat / (sqrt(v_hat) + eps) + wd * q)``).  A policy decides what is stored next:

* ``rne``: store ``Q_rne(q + d)``; a proposal under half a grid gap is lost, every time.
* ``stochastic``: store ``Q_sr(q + d)``, rounding up with probability ``(x - lo) / (hi - lo)``,
  so ``E[Q_sr(x)] = x`` (unbiased); extra state: the seeded generator.
* ``master``: ``w <- w + d`` in an fp32 master, store ``Q_rne(w)``; extra state: 4 B/coordinate.
* ``selective_master``: a master only for the tiles of a :class:`~snip.optim.mask.TileMask`
  (exact memory budget), direct ``rne`` elsewhere; extra state: 4 B + 8 B index per protected
  coordinate.
* ``eco``: store ``Q_rne(q + d)`` and feed the lost error ``e`` back into Adam's first moment.

ECO (Nikdan et al., arXiv 2601.22101), in its Adam form:
after the normal Adam(W) step gives ``theta~``, store ``theta^ = Q(theta~)`` with error
``e = theta~ - theta^`` and correct the first moment

    m <- m + ((1 - beta1^t) / lr) * (1 - 1/beta1) * (sqrt(v / (1 - beta2^t)) + eps) * e

so the error re-enters future updates through the momentum, with no extra buffer.  Optional
``decay_correction`` multiplies by ``(1 - lr * wd)`` (Cesista's AdamW extension).

Masters are initialised from the fp32 initial weights (not from ``Q(init)``), so a master run
starts from exactly the fp32 baseline's weights.  Policies are small strategy objects; the
:class:`Policy` enum holds their names.  Data flow: ``WritebackOptimizer.step`` calls
``before_step`` (swap masters in), runs the wrapped optimizer, then ``write`` per tensor.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from snip.errors import UserError, parse_enum
from snip.formats import Rounding
from snip.formats.cast import as_rounding
from snip.optim.grid import StorageGrid
from snip.optim.mask import TileMask


class Policy(enum.Enum):
    RNE = "rne"
    STOCHASTIC = "stochastic"
    MASTER = "master"
    SELECTIVE_MASTER = "selective_master"
    ECO = "eco"


def as_policy(name: Policy | str) -> Policy:
    return parse_enum(Policy, name, "write-back policy")


@dataclass(kw_only=True)
class Slot:
    """One managed parameter and the policy's per-parameter state."""

    name: str
    param: torch.Tensor
    state: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass(kw_only=True)
class StepContext:
    """What ``write`` may need besides the tensor: the grid, the RNG and the optimizer."""

    grid: StorageGrid
    generator: torch.Generator
    optimizer: torch.optim.Optimizer
    group: dict


class WritebackPolicy:
    """Base strategy: direct round-to-nearest write-back, no extra state."""

    policy: Policy = Policy.RNE
    rounding: Rounding = Rounding.RNE

    def setup(self, slot: Slot, grid: StorageGrid) -> None:
        """Called once when the parameter is wrapped (before the initial write)."""

    def before_step(self, slot: Slot) -> None:
        """Put what the optimizer should step from into ``slot.param``."""

    def write(self, slot: Slot, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """Given the optimizer's fp32 result ``x``, return the new stored value."""
        return ctx.grid.round(x, self.rounding, ctx.generator)

    def extra_bytes(self, slot: Slot) -> int:
        return sum(t.numel() * t.element_size() for t in slot.state.values())


class RNEPolicy(WritebackPolicy):
    policy = Policy.RNE


class StochasticPolicy(WritebackPolicy):
    policy = Policy.STOCHASTIC
    rounding = Rounding.STOCHASTIC


class MasterPolicy(WritebackPolicy):
    """Blanket fp32 master for every coordinate."""

    policy = Policy.MASTER

    def setup(self, slot: Slot, grid: StorageGrid) -> None:
        slot.state["master"] = slot.param.detach().float().clone()

    def before_step(self, slot: Slot) -> None:
        slot.param.data.copy_(slot.state["master"])

    def write(self, slot: Slot, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        slot.state["master"].copy_(x)
        return ctx.grid.round(x, Rounding.RNE)


class SelectiveMasterPolicy(WritebackPolicy):
    """fp32 master only for the coordinates of ``mask``; direct RNE for the rest."""

    policy = Policy.SELECTIVE_MASTER

    def __init__(self, mask: TileMask) -> None:
        if not isinstance(mask, TileMask):
            raise UserError("selective_master needs a TileMask (load one with TileMask.load or "
                            "build one with snip.audit.allocate)")
        self.mask = mask

    def setup(self, slot: Slot, grid: StorageGrid) -> None:
        idx = self.mask.indices(slot.name) if slot.name in self.mask.shapes else None
        if idx is None:
            idx = torch.zeros(0, dtype=torch.int64)
        slot.state["index"] = idx.to(slot.param.device)
        slot.state["master"] = slot.param.detach().reshape(-1)[slot.state["index"]].float().clone()

    def before_step(self, slot: Slot) -> None:
        if slot.state["index"].numel():
            slot.param.data.view(-1)[slot.state["index"]] = slot.state["master"]

    def write(self, slot: Slot, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        if slot.state["index"].numel():
            slot.state["master"].copy_(x.reshape(-1)[slot.state["index"]])
        return ctx.grid.round(x, Rounding.RNE)


@dataclass(frozen=True, kw_only=True)
class _AdamState:
    m: torch.Tensor
    v: torch.Tensor
    t: float
    lr: float
    beta1: float
    beta2: float
    eps: float
    wd: float


def _adam_state(ctx: StepContext, p: torch.Tensor) -> _AdamState:
    st = ctx.optimizer.state.get(p, {})
    if "exp_avg" not in st or "exp_avg_sq" not in st:
        raise UserError(f"eco needs an Adam/AdamW optimizer (state exp_avg, exp_avg_sq); got "
                        f"{type(ctx.optimizer).__name__}. Use torch.optim.AdamW or policy "
                        f"'stochastic'")
    b1, b2 = ctx.group["betas"]
    return _AdamState(m=st["exp_avg"], v=st["exp_avg_sq"], t=float(st["step"]),
                      lr=float(ctx.group["lr"]), beta1=float(b1), beta2=float(b2),
                      eps=float(ctx.group["eps"]), wd=float(ctx.group.get("weight_decay", 0.0)))


class ECOPolicy(WritebackPolicy):
    """Error feedback into Adam's first moment (ECO-Adam, Nikdan et al., arXiv 2601.22101).

    ``rounding``: how the quantizer inside ECO rounds the optimizer's result before the error
    ``x - Q(x)`` is fed back. The ECO paper's headline configuration rounds *stochastically*
    (the default); ``rne`` is the deterministic variant, whose residual error is biased and
    which recovers markedly less of the gap (docs/writeback.md)."""

    policy = Policy.ECO

    def __init__(self, rounding: Rounding | str = Rounding.STOCHASTIC,
                 decay_correction: bool = False) -> None:
        self.rounding = as_rounding(rounding)
        self.decay_correction = decay_correction

    def write(self, slot: Slot, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        q = ctx.grid.round(x, self.rounding, ctx.generator)
        s = _adam_state(ctx, slot.param)
        if s.lr == 0.0 or s.beta1 == 0.0:
            return q  # the correction divides by lr and beta1; no momentum to carry it
        e = x - q
        coef = (1.0 - s.beta1**s.t) / s.lr * (1.0 - 1.0 / s.beta1)
        if self.decay_correction:
            coef *= 1.0 - s.lr * s.wd
        denom = (s.v / (1.0 - s.beta2**s.t)).sqrt().add_(s.eps)
        s.m.add_(denom.mul_(e).mul_(coef))
        return q


def make_policy(policy: Policy | str | WritebackPolicy, mask: TileMask | None = None,
                eco_rounding: Rounding | str = Rounding.STOCHASTIC) -> WritebackPolicy:
    """A strategy object from a name (a ready-made ``WritebackPolicy`` passes through);
    ``eco_rounding`` is the rounding inside the ``eco`` policy's quantizer."""
    if isinstance(policy, WritebackPolicy):
        return policy
    p = as_policy(policy)
    if p is Policy.SELECTIVE_MASTER:
        if mask is None:
            raise UserError("policy 'selective_master' needs a mask: pass mask=TileMask or "
                            "--writeback.mask FILE")
        return SelectiveMasterPolicy(mask)
    if mask is not None:
        raise UserError(f"a mask only applies to policy 'selective_master', not {p.value!r}")
    if p is Policy.ECO:
        return ECOPolicy(rounding=eco_rounding)
    return {Policy.RNE: RNEPolicy, Policy.STOCHASTIC: StochasticPolicy,
            Policy.MASTER: MasterPolicy}[p]()


