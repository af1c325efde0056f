"""Element formats: the value sets that individual numbers are rounded onto.

A floating-point element format ``ExMy`` stores a sign bit, ``E`` exponent bits with a bias and
``M`` explicit mantissa bits.  A normal number is ``(-1)^s * 2^(e - bias) * (1 + f / 2^M)``, a
subnormal (exponent field 0) is ``(-1)^s * 2^(1 - bias) * (f / 2^M)``.  The formats differ in what
the all-ones exponent field means:

* ``IEEE``   -- all-ones exponent is inf (mantissa 0) or NaN (e5m2, fp16, bf16, fp32);
* ``FN``     -- "finite, NaN only": only S.1111.111 is NaN, the rest of the top binade holds
                numbers (OCP FP8 E4M3, max 448);
* ``NONE``   -- no special values at all; every code is a number (FP6 E3M2/E2M3, FP4 E2M1).

Integer element formats are symmetric two's complement grids ``k * step`` with
``|k| <= 2^(bits-1) - 1`` (the most negative code is unused, as in MXINT8 and symmetric INT4/INT8).

Everything here is a frozen value object; rounding lives in :mod:`snip.formats.cast`.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from snip.errors import UserError


class Special(enum.Enum):
    """What the all-ones exponent field encodes."""

    IEEE = "ieee"
    FN = "fn"
    NONE = "none"


class Kind(enum.Enum):
    FLOAT = "float"
    INT = "int"


@dataclass(frozen=True, kw_only=True)
class ElementFormat:
    """One element format, with every derived constant spelt out.

    ``mbits`` excludes the implicit leading bit.  For integer formats ``ebits`` is 0 and the grid
    is ``k * step`` for integer ``|k| <= int_max``.
    """

    name: str
    kind: Kind
    bits: int
    ebits: int = 0
    mbits: int = 0
    bias: int = 0
    special: Special = Special.NONE
    step: float = 1.0  # integer formats only: value of one integer step
    max_normal: float = field(init=False)
    min_normal: float = field(init=False)
    min_subnormal: float = field(init=False)
    emax: int = field(init=False)  # exponent of the largest binade (MX: emax_elem)
    emin: int = field(init=False)  # exponent of the smallest normal binade

    def __hash__(self) -> int:
        """The name's hash (equal formats have equal names; see ``QuantSpec.__hash__``)."""
        return hash(self.name)

    def __post_init__(self) -> None:
        if self.kind is Kind.INT:
            if self.bits < 2:
                raise UserError(f"integer format {self.name!r} needs at least 2 bits")
            int_max = 2 ** (self.bits - 1) - 1
            vals = (
                int_max * self.step,
                self.step,
                self.step,
                math.floor(math.log2(int_max * self.step)),
                0,
            )
        else:
            if self.ebits < 1 or self.mbits < 0 or self.bits != 1 + self.ebits + self.mbits:
                raise UserError(
                    f"float format {self.name!r}: bits ({self.bits}) must be 1 + ebits + mbits"
                )
            top = 2**self.ebits - 1  # all-ones exponent field
            emin = 1 - self.bias
            if self.special is Special.IEEE:
                emax, max_mant = top - 1 - self.bias, 2**self.mbits - 1
            elif self.special is Special.FN:
                emax, max_mant = top - self.bias, 2**self.mbits - 2
            else:
                emax, max_mant = top - self.bias, 2**self.mbits - 1
            max_normal = 2.0**emax * (1 + max_mant / 2**self.mbits)
            vals = (max_normal, 2.0**emin, 2.0 ** (emin - self.mbits), emax, emin)
        names = ("max_normal", "min_normal", "min_subnormal", "emax", "emin")
        for name, v in zip(names, vals, strict=True):
            object.__setattr__(self, name, v)

    @property
    def is_float(self) -> bool:
        return self.kind is Kind.FLOAT

    @property
    def int_max(self) -> int:
        """Largest integer code magnitude (integer formats)."""
        return 2 ** (self.bits - 1) - 1

    @property
    def has_inf(self) -> bool:
        return self.kind is Kind.FLOAT and self.special is Special.IEEE

    def __str__(self) -> str:
        return self.name


def float_format(
    ebits: int,
    mbits: int,
    *,
    bias: int | None = None,
    special: Special = Special.NONE,
    name: str | None = None,
) -> ElementFormat:
    """Generic constructor for any ``ExMy`` float format (default bias ``2^(E-1) - 1``)."""
    if ebits < 1 or mbits < 0:
        raise UserError(f"invalid float format e{ebits}m{mbits}: need ebits >= 1, mbits >= 0")
    bias = 2 ** (ebits - 1) - 1 if bias is None else bias
    if ebits > 8 or mbits > 23:
        raise _unsupported(f"e{ebits}m{mbits}")
    fmt = ElementFormat(
        name=name or f"e{ebits}m{mbits}",
        kind=Kind.FLOAT,
        bits=1 + ebits + mbits,
        ebits=ebits,
        mbits=mbits,
        bias=bias,
        special=special,
    )
    # Rounded values are held in float32 tensors: every value of the format must be a float32.
    if fmt.max_normal > FLOAT32_MAX or fmt.emin - mbits < -149:
        raise _unsupported(fmt.name)
    return fmt


FLOAT32_MAX = 3.4028234663852886e38


def _unsupported(name: str) -> UserError:
    return UserError(f"element format {name} is outside what snip emulates exactly: every value "
                     "must be a float32, so ebits must be 1..7 and mbits 0..23 (e8 only with "
                     "IEEE inf/NaN, as bf16 and fp32), e.g. e2m1, e4m3, e5m2, e3m4, e6m9")


def int_format(bits: int, *, frac_bits: int = 0, name: str | None = None) -> ElementFormat:
    """Symmetric integer format with ``frac_bits`` fractional bits (MXINT8: bits 8, frac 6)."""
    return ElementFormat(name=name or f"int{bits}", kind=Kind.INT, bits=bits, step=2.0**-frac_bits)


ELEMENTS: dict[str, ElementFormat] = {
    f.name: f
    for f in (
        float_format(4, 3, special=Special.FN, name="e4m3"),
        float_format(5, 2, special=Special.IEEE, name="e5m2"),
        float_format(3, 2, name="e3m2"),
        float_format(2, 3, name="e2m3"),
        float_format(2, 1, name="e2m1"),
        int_format(8, name="int8"),
        int_format(4, name="int4"),
        int_format(8, frac_bits=6, name="mxint8"),
        float_format(8, 7, special=Special.IEEE, name="bf16"),
        float_format(5, 10, special=Special.IEEE, name="fp16"),
        float_format(8, 23, special=Special.IEEE, name="fp32"),
    )
}


def get_element(name: str | ElementFormat) -> ElementFormat:
    """Look up an element format by name (or pass one through); ``e3m4``-style names build one."""
    if isinstance(name, ElementFormat):
        return name
    if not isinstance(name, str):
        raise TypeError(
            f"element format must be a name or ElementFormat, got {type(name).__name__}"
        )
    key = name.lower()
    if key in ELEMENTS:
        return ELEMENTS[key]
    import re

    m = re.fullmatch(r"e(\d+)m(\d+)", key)
    if m and int(m.group(1)) >= 1:
        return float_format(int(m.group(1)), int(m.group(2)))
    raise UserError(
        f"unknown element format {name!r}; valid names: {', '.join(ELEMENTS)} (or any 'eXmY')"
    )
