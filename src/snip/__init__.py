"""snip: FP8 and sub-byte LLM training with adaptive per-layer precision and safe write-back."""

from snip.formats import (
    PRESETS,
    ElementFormat,
    QTensor,
    QuantSpec,
    Rounding,
    cast,
    encode,
    get_element,
    get_spec,
    quantize,
)

__version__ = "0.1.0"

__all__ = [
    "PRESETS", "ElementFormat", "QTensor", "QuantSpec", "Rounding", "cast", "encode", "get_element",
    "get_spec", "quantize", "__version__",
]
