"""Number formats: element formats, rounding, block scaling, presets, packed storage.

Pure numerics -- no ``nn.Module``, no autograd.  Start with :func:`cast` (element rounding),
:func:`quantize` (block-scaled fake quantization) and :func:`encode` (real packed storage).

Names load on first use (PEP 562): the tables of formats and presets (``ELEMENTS``,
``PRESETS``, ``get_spec``...) come from torch-free modules, so ``snip formats`` answers without
importing torch; the quantizers import it when first touched.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING

_WHERE = {
    "Rounding": "rounding",
    "as_rounding": "rounding",
    "cast": "cast",
    "cast_reference": "cast",
    "code_table": "codes",
    "decode_codes": "codes",
    "encode_codes": "codes",
    "pack": "codes",
    "unpack": "codes",
    "ELEMENTS": "element",
    "ElementFormat": "element",
    "Kind": "element",
    "Special": "element",
    "float_format": "element",
    "get_element": "element",
    "int_format": "element",
    "QTensor": "quantize",
    "encode": "quantize",
    "quantize": "quantize",
    "replace_spec": "quantize",
    "RowShard": "scaling",
    "PRESETS": "spec",
    "E8M0Rule": "spec",
    "QuantSpec": "spec",
    "ScaleFormat": "spec",
    "Scaling": "spec",
    "get_spec": "spec",
    "is_fp4": "spec",
}

__all__ = [
    "E8M0Rule",
    "ELEMENTS",
    "ElementFormat",
    "Kind",
    "PRESETS",
    "QTensor",
    "QuantSpec",
    "Rounding",
    "RowShard",
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


class _Package(types.ModuleType):
    """Two submodules share their name with their main function (``quantize``, ``cast``);
    importing the submodule must not replace the function on the package."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in _WHERE and isinstance(value, types.ModuleType):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str):
    if name in _WHERE:
        value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))


if TYPE_CHECKING:  # for type checkers and IDEs; never executed
    from snip.formats.cast import cast, cast_reference
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
    from snip.formats.rounding import Rounding, as_rounding
    from snip.formats.scaling import RowShard
    from snip.formats.spec import (
        PRESETS,
        E8M0Rule,
        QuantSpec,
        ScaleFormat,
        Scaling,
        get_spec,
        is_fp4,
    )
