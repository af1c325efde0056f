"""snip: FP8 and sub-byte LLM training with adaptive per-layer precision and safe write-back.

The public contract (``shared/DESIGN.md`` section 3)::

    snip.cast(x, "e2m1")            element rounding, no scaling
    snip.quantize(x, "mxfp4")       fake quantization (quantize + dequantize)
    snip.encode(x, "nvfp4")         real packed storage -> QTensor.dequantize()
    snip.QuantSpec                  what a preset name resolves to
    snip.PrecisionPlan              per-layer, per-GEMM formats; JSON round trip
    snip.convert(model, plan)       swap nn.Linear for QLinear
"""

from snip.errors import UserError
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
from snip.nn import GemmSpecs, QLinear, convert, disabled, unconvert
from snip.plan import PrecisionPlan

__version__ = "0.1.0"

__all__ = [
    "PRESETS",
    "ElementFormat",
    "GemmSpecs",
    "PrecisionPlan",
    "QLinear",
    "QTensor",
    "QuantSpec",
    "Rounding",
    "UserError",
    "__version__",
    "cast",
    "convert",
    "disabled",
    "encode",
    "get_element",
    "get_spec",
    "quantize",
    "unconvert",
]
