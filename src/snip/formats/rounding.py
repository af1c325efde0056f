"""Rounding modes (kept free of torch so that tables and specs load without it)."""

from __future__ import annotations

import enum

from snip.errors import parse_enum


class Rounding(enum.Enum):
    RNE = "rne"
    STOCHASTIC = "stochastic"


def as_rounding(rounding: Rounding | str) -> Rounding:
    return parse_enum(Rounding, rounding, "rounding")
