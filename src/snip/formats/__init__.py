"""Number formats: element formats, rounding, block scaling, presets, packed storage.

Pure numerics -- no ``nn.Module``, no autograd.  Start with :func:`cast` (element rounding),
:func:`quantize` (block-scaled fake quantization) and :func:`encode` (real packed storage).
"""

from snip.formats.cast import Rounding, as_rounding, cast, cast_reference
from snip.formats.codes import code_table, decode_codes, encode_codes, pack, unpack
from snip.formats.element import (
    ELEMENTS,
    ElementFormat,
    Kind,
    Special,
    float_format,
    get_element,
    int_format,
)
from snip.formats.quantize import QTensor, encode, quantize, replace_spec
from snip.formats.spec import PRESETS, E8M0Rule, QuantSpec, ScaleFormat, Scaling, get_spec, is_fp4

__all__ = [
    "ELEMENTS",
    "PRESETS",
    "E8M0Rule",
    "ElementFormat",
    "Kind",
    "QTensor",
    "QuantSpec",
    "Rounding",
    "ScaleFormat",
    "Scaling",
    "Special",
    "as_rounding",
    "cast",
    "cast_reference",
    "code_table",
    "decode_codes",
    "encode",
    "encode_codes",
    "float_format",
    "get_element",
    "get_spec",
    "int_format",
    "is_fp4",
    "pack",
    "quantize",
    "replace_spec",
    "unpack",
]
