"""snip: FP8 and sub-byte LLM training with adaptive per-layer precision and safe write-back.

The public contract (kept stable across releases)::

    snip.cast(x, "e2m1")            element rounding, no scaling
    snip.quantize(x, "mxfp4")       fake quantization (quantize + dequantize)
    snip.encode(x, "nvfp4")         real packed storage -> QTensor.dequantize()
    snip.QuantSpec                  what a preset name resolves to
    snip.PrecisionPlan              per-layer, per-GEMM formats; JSON round trip
    snip.convert(model, plan)       swap nn.Linear (and HF Conv1D) for QLinear
    snip.audit, snip.optim, ...     every subpackage, loaded on first use

Why everything is lazy (PEP 562): ``import torch`` alone takes one to two seconds, and
``snip --help`` or ``snip formats`` should not pay for torch, numba and scipy before printing a
line.  So ``import snip`` imports nothing; the first access to ``snip.quantize`` imports
``snip.formats`` (and torch), the first access to ``snip.audit`` imports ``snip.audit``, and the
result is cached in this module's namespace so later accesses cost a dict lookup.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# top-level name -> the subpackage that defines it
_NAMES = {
    **dict.fromkeys(("PRESETS", "ElementFormat", "QTensor", "QuantSpec", "Rounding", "cast",
                     "encode", "get_element", "get_spec", "quantize"), "snip.formats"),
    **dict.fromkeys(("GemmSpecs", "QLinear", "convert", "disabled", "unconvert"), "snip.nn"),
    "PrecisionPlan": "snip.plan",
    "UserError": "snip.errors",
}
SUBPACKAGES = ("audit", "cli", "compare", "data", "errors", "formats", "integrations", "models",
               "nn", "optim", "plan", "planner", "report", "sensitivity", "train")

__all__ = sorted([*_NAMES, *SUBPACKAGES, "__version__"])


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name]), name)
    elif name in SUBPACKAGES:
        try:
            value = importlib.import_module(f"snip.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"snip.{name}":
                raise  # a missing dependency inside the subpackage: keep the real error
            raise AttributeError(f"module 'snip' has no attribute {name!r}") from None
    else:
        raise AttributeError(f"module 'snip' has no attribute {name!r}")
    globals()[name] = value  # cache: __getattr__ runs only for names not found normally
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:  # static tools see the real names
    from snip import (  # noqa: F401
        audit,
        cli,
        compare,
        data,
        formats,
        models,
        nn,
        optim,
        plan,
        planner,
        report,
        sensitivity,
        train,
    )
    from snip.errors import UserError  # noqa: F401
    from snip.formats import (  # noqa: F401
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
    from snip.nn import GemmSpecs, QLinear, convert, disabled, unconvert  # noqa: F401
    from snip.plan import PrecisionPlan  # noqa: F401
