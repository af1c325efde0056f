"""The exact invisible-update event against brute force, rho, and the SR probability.

Tolerances: every ``approx`` here compares float64 arithmetic on the same numbers summed in
another order (an ILP's objective against brute force's, a fraction of integer FLOPs, a JSON
round trip); Python floats round the same on every CPU, so ``rel=1e-9`` (or approx's default
1e-6) is millions of times wider than the ~n x 2^-53 such a sum can differ by."""

from __future__ import annotations

import math

import pytest
import torch

from snip.audit.events import (
    RHO_STAR,
    freeze_probability,
    grid_gaps,
    invisible,
    invisible_probability,
    projected_frozen,
    rho,
)
from snip.formats import cast, code_table, get_element

SMALL = ["e2m1", "e3m2", "e2m3", "e4m3", "e5m2"]


def _grid(name: str) -> torch.Tensor:
    t = code_table(get_element(name))
    return t[torch.isfinite(t)]


def _sweep(q: torch.Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Every code x a sweep of d: fractions of each side's gap, exact half gaps and their
    fp32 neighbours, and a few huge steps."""
    s_lo, s_hi = grid_gaps(q, name)
    fin = lambda s: torch.where(torch.isfinite(s), s, torch.ones_like(s))  # noqa: E731
    fr = torch.tensor([0.0, 0.1, 0.25, 0.49, 0.5, 0.51, 0.75, 1.0, 1.5, 3.0], dtype=torch.float64)
    ds = [(-fin(s_lo))[:, None] * fr, fin(s_hi)[:, None] * fr]
    d = torch.cat(ds, 1).float()
    half = torch.stack([-fin(s_lo) / 2, fin(s_hi) / 2], 1).float()
    x_half = q[:, None] + half  # exact midpoints, then their fp32 neighbours as d
    d = torch.cat([d, half, torch.nextafter(x_half, x_half + 1) - q[:, None],
                   torch.nextafter(x_half, x_half - 1) - q[:, None],
                   torch.full_like(half, 1e6), torch.full_like(half, -1e6)], 1)
    return q[:, None].expand_as(d).contiguous(), d


@pytest.mark.parametrize("name", SMALL)
def test_invisible_rne_equals_brute_force_every_code(name):
    q, d = _sweep(_grid(name), name)
    brute = cast(q + d, name) == q
    assert torch.equal(invisible(q, d, name), brute)
    # both outcomes occur, so the test has teeth
    assert brute.any() and (~brute).any()


def test_invisible_random_values_bf16_and_fp16():
    g = torch.Generator().manual_seed(0)
    for name in ("bf16", "fp16"):
        q = cast(torch.randn(20000, generator=g) * 0.05, name)
        d = torch.randn(20000, generator=g) * 1e-3 * torch.rand(20000, generator=g)
        assert torch.equal(invisible(q, d, name), cast(q + d, name) == q)


def test_invisible_rejects_off_grid():
    with pytest.raises(ValueError, match="grid"):
        invisible(torch.tensor([0.3]), torch.tensor([0.0]), "e2m1")


def test_binade_edge_asymmetric_and_zero():
    s_lo, s_hi = grid_gaps(torch.tensor([1.0, 0.0, 448.0, -448.0]), "e4m3")
    assert s_lo.tolist()[:2] == [0.0625, 2**-9] and s_hi.tolist()[:2] == [0.125, 2**-9]
    assert math.isinf(s_hi[2]) and math.isinf(s_lo[3])


def test_stochastic_event_and_probability():
    q = cast(torch.full((200000,), 1.0), "e4m3")
    d = torch.full_like(q, 0.125 * 0.3)  # 30 % of the gap above 1.0
    p = invisible_probability(q, d, "e4m3")
    assert torch.allclose(p, torch.full_like(p, 0.7))
    ev = invisible(q, d, "e4m3", rounding="stochastic", generator=1)
    assert abs(ev.float().mean().item() - 0.7) < 0.005
    ev2 = invisible(q, d, "e4m3", rounding="stochastic", generator=1)
    assert torch.equal(ev, ev2)
    assert torch.equal(invisible_probability(q, d, "e4m3", "rne"), torch.ones_like(p))


def test_rho_boundary():
    assert freeze_probability(RHO_STAR) == pytest.approx(0.5)
    assert freeze_probability(0.4) == 1.0 and freeze_probability(1.2) == 0.0
    assert rho(1.0, 1.0, "e4m3") == pytest.approx(16.0)


def test_rho_majority_boundary_empirically():
    """Log-uniform phases: the frozen fraction crosses 1/2 at rho = 1/sqrt(2) (RNE, bf16)."""
    g = torch.Generator().manual_seed(0)
    w = cast(torch.exp2(torch.rand(200000, generator=g) * 8 - 8), "bf16")
    eps = 2.0**-8
    for r, want in ((0.5, 1.0), (RHO_STAR, 0.5), (1.0, 0.0)):
        frac = projected_frozen(w, r * eps * w, "bf16").float().mean().item()
        assert abs(frac - want) < 0.02, (r, frac)
