"""The exact invisible-update event and the scale-free ratio rho.

**Event (Eq. 1).**  A stored code ``q`` receives the optimizer proposal ``d``; the write-back
stores ``Q(q + d)``.  The update is *invisible* when ``Q(q + d) == q``: the code did not change
although ``d != 0``.  The sum ``x = q + d`` is formed in fp32, exactly as the write-back does.

**Interval form (Eq. 2).**  For round-to-nearest-even onto grid ``G`` with gaps ``s-`` (to the
neighbour below ``q``) and ``s+`` (above):

    Q_rne(x) == q   <=>   q - s-/2  <=  x  <=  q + s+/2,

each endpoint included iff the tie goes to ``q``, i.e. iff ``q`` is even in units of that side's
spacing (``|q| / s`` even: the mantissa LSB rule, also right at binade edges).  At the bottom of a
normal binade ``s- = s+/2`` (asymmetric); at ``q = 0`` both gaps are the smallest subnormal; a
saturating cast makes the outer gap at ``+-max`` infinite.  :func:`invisible` implements this
interval test from the grid geometry alone; the tests check it against brute force ``cast`` over
every code of e2m1, e3m2, e2m3, e4m3 and e5m2.

**Stochastic rounding.**  ``Q_sr`` is random, so the event is too.  :func:`invisible` with
``rounding="stochastic"`` returns the *realised* event for the given generator (the write-back
draws one uniform per coordinate in the same order, so the same generator state gives the same
event); :func:`invisible_probability` returns ``P(Q_sr(q + d) == q) = max(0, 1 - |x - q| / s)``
with ``s`` the gap on the side of ``x`` (1 or 0 for RNE).

**Scale-free ratio (Eq. 3).**  ``rho = ||d|| / (eps ||w||)`` with ``eps = 2^-(M+1)`` the unit
roundoff of an ``M``-mantissa-bit format; ``d`` is the full proposal (``eta * g`` for SGD, the
Adam step for Adam).  Per coordinate, ``|w| = 2^(e + phi)`` freezes iff ``rho_i < 2^-phi``; with
the phase ``phi`` uniform in log2 scale, ``P(frozen | rho) = clamp(-log2 rho, 0, 1)``, which is
1/2 at ``rho* = 1/sqrt(2)``: the majority-freeze boundary.  (Decision recorded in
``docs/writeback.md``: unit roundoff, log-uniform phase, proposal norm.)

Data flow: :mod:`snip.optim.writeback` records ``Q(x) == q`` directly while training; this module
gives the same event from ``(q, d)`` for any format, which is what the projected-reference proxy
(:mod:`snip.audit.trace`) uses on an fp32 trace.
"""

from __future__ import annotations

import math

import torch

from snip.errors import UserError
from snip.formats import ElementFormat, Kind, Rounding, as_rounding, cast, get_element

RHO_STAR = 2.0**-0.5


def _float_gaps(a: torch.Tensor, fmt: ElementFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """(toward-zero gap, away-from-zero gap) of magnitudes ``a`` on a float grid (float64)."""
    safe = torch.where(a > 0, a, torch.ones_like(a))
    e = (torch.frexp(safe).exponent - 1).clamp(min=fmt.emin)
    ulp = torch.ldexp(torch.ones_like(a), e - fmt.mbits)
    bottom = (a == torch.ldexp(torch.ones_like(a), e)) & (e > fmt.emin)
    toward = torch.where(bottom, ulp / 2, ulp)
    toward = torch.where(a == 0, torch.full_like(a, fmt.min_subnormal), toward)
    away = torch.where(a == 0, torch.full_like(a, fmt.min_subnormal), ulp)
    return toward, away


def grid_gaps(q: torch.Tensor, element: ElementFormat | str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s-, s+)``: distance from grid values ``q`` to the next grid value below and above.

    float64 tensors; ``inf`` on the saturating side of ``+-max``.
    """
    fmt = get_element(element)
    qd = q.detach().double()
    a = qd.abs()
    if fmt.kind is Kind.INT:
        toward = torch.full_like(a, fmt.step)
        away = toward.clone()
        top = fmt.int_max * fmt.step
    else:
        toward, away = _float_gaps(a, fmt)
        top = fmt.max_normal
    away = torch.where(a >= top, torch.full_like(a, math.inf), away)
    neg = torch.signbit(qd) & (a > 0)
    return torch.where(neg, away, toward), torch.where(neg, toward, away)


def check_on_grid(q: torch.Tensor, element: ElementFormat | str) -> None:
    on = (cast(q.float(), element) == q.float()) | torch.isnan(q)
    if not bool(on.all()):
        bad = float(q.flatten()[(~on).flatten().nonzero()[0, 0]])
        raise UserError(f"q must hold values on the {get_element(element).name} grid (found "
                        f"{bad!r}); pass snip.cast(w, element) as q")


def _even(a: torch.Tensor, gap: torch.Tensor) -> torch.Tensor:
    t = torch.where(torch.isfinite(gap), a / gap, torch.zeros_like(a))
    return torch.remainder(torch.round(t), 2) == 0


def invisible(q: torch.Tensor, d: torch.Tensor, element: ElementFormat | str,
              rounding: Rounding | str = Rounding.RNE,
              generator: torch.Generator | int | None = None) -> torch.Tensor:
    """Bool tensor: ``Q(q + d) == q`` per coordinate (the exact invisible-update event).

    ``q`` must lie on ``element``'s grid (scale 1).  RNE: the interval test of the module
    docstring.  Stochastic: the realised event for ``generator`` (global RNG when ``None``).
    """
    fmt, mode = get_element(element), as_rounding(rounding)
    check_on_grid(q, fmt)
    x = q.float() + d.float()
    if mode is Rounding.STOCHASTIC:
        return cast(x, fmt, mode, saturate=True, generator=generator) == q.float()
    s_lo, s_hi = grid_gaps(q, fmt)
    qd, xd = q.double(), x.double()
    lo, hi = qd - s_lo / 2, qd + s_hi / 2
    a = qd.abs()
    inside = (xd > lo) & (xd < hi)
    return inside | ((xd == lo) & _even(a, s_lo)) | ((xd == hi) & _even(a, s_hi))


def invisible_probability(q: torch.Tensor, d: torch.Tensor, element: ElementFormat | str,
                          rounding: Rounding | str = Rounding.STOCHASTIC) -> torch.Tensor:
    """``P(Q(q + d) == q)`` per coordinate (fp32): ``1 - |x - q| / s`` under stochastic rounding."""
    fmt, mode = get_element(element), as_rounding(rounding)
    if mode is Rounding.RNE:
        return invisible(q, d, fmt).float()
    check_on_grid(q, fmt)
    x = (q.float() + d.float()).double()
    s_lo, s_hi = grid_gaps(q, fmt)
    gap = torch.where(x >= q.double(), s_hi, s_lo)
    p = 1.0 - (x - q.double()).abs() / gap
    return p.clamp(min=0.0).float()


def unit_roundoff(element: ElementFormat | str) -> float:
    """``eps = 2^-(M+1)``: half the spacing at 1.0 (integer formats: half a step)."""
    fmt = get_element(element)
    return fmt.step / 2 if fmt.kind is Kind.INT else 2.0 ** -(fmt.mbits + 1)


def rho(update_norm: float, weight_norm: float, element: ElementFormat | str) -> float:
    """Scale-free ratio ``rho = ||d|| / (eps ||w||)`` (Eq. 3); ``inf`` for a zero weight."""
    denom = unit_roundoff(element) * weight_norm
    return math.inf if denom == 0 else update_norm / denom


def freeze_probability(r: float | torch.Tensor) -> float | torch.Tensor:
    """``P(frozen | rho) = clamp(-log2 rho, 0, 1)`` under a log-uniform within-binade phase."""
    if isinstance(r, torch.Tensor):
        return (-torch.log2(r)).clamp(0.0, 1.0)
    return 1.0 if r <= 0 else min(1.0, max(0.0, -math.log2(r)))


def projected_frozen(w: torch.Tensor, d: torch.Tensor,
                     element: ElementFormat | str) -> torch.Tensor:
    """Proxy (P-a) for one reference step: ``Q(Q(w) + d) == Q(w)`` with RNE, from fp32 ``w, d``."""
    q = cast(w.detach().float(), element)
    return invisible(q, d, element)
