"""Rounding modes (kept free of torch so that tables and specs load without it)."""

from __future__ import annotations

import enum

from snip.errors import UserError


class Rounding(enum.Enum):
    RNE = "rne"
    STOCHASTIC = "stochastic"


def as_rounding(rounding: Rounding | str) -> Rounding:
    if isinstance(rounding, Rounding):
        return rounding
    try:
        return Rounding(str(rounding).lower())
    except ValueError:
        valid = ", ".join(r.value for r in Rounding)
        raise UserError(f"unknown rounding {rounding!r}; valid: {valid}") from None
