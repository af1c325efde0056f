"""Sensitivity of the loss and of the weight updates to each layer's GEMM precision.

* :func:`measure` -- one statistics cycle (clean pass, backward noise pass, forward noise pass)
  -> :class:`SensitivityTable`, the versioned JSON of per layer x GEMM x candidate divergences.
* :mod:`snip.sensitivity.probes` -- hooks that exist only while a probe is active.
* :mod:`snip.sensitivity.adam` -- the linearised AdamW update gain.
"""
from snip.sensitivity.estimate import SensitivityConfig, measure
from snip.sensitivity.table import (
    TABLE_VERSION,
    LayerEntry,
    Metric,
    Normalization,
    SensitivityTable,
    normalize,
    synthetic_table,
)

__all__ = ["TABLE_VERSION", "LayerEntry", "Metric", "Normalization", "SensitivityConfig",
           "SensitivityTable", "measure", "normalize", "synthetic_table"]
