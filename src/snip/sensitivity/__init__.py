"""Sensitivity of the loss and of the weight updates to each layer's GEMM precision.

* :class:`SensitivityTable` -- versioned JSON of per layer x GEMM x candidate divergences.
"""

from snip.sensitivity.table import (
    TABLE_VERSION,
    LayerEntry,
    Metric,
    Normalization,
    SensitivityTable,
    normalize,
    synthetic_table,
)

__all__ = ["TABLE_VERSION", "LayerEntry", "Metric", "Normalization", "SensitivityTable",
           "normalize", "synthetic_table"]
