"""Sensitivity of the loss and of the weight updates to each layer's GEMM precision.

* :func:`measure` -- one statistics cycle (clean pass, forward noise pass for the curvature,
  error-shaped dgrad probe) -> :class:`SensitivityTable`, the versioned JSON of per layer x
  GEMM x candidate divergences; :func:`blend` averages tables across cycles.
* :mod:`snip.sensitivity.propagate` -- the dgrad probe and its one-pass attribution.
* :mod:`snip.sensitivity.probes` -- hooks that exist only while a probe is active.
* :mod:`snip.sensitivity.adam` -- the linearised AdamW update gain and the nats weight.
* :mod:`snip.sensitivity.loss` -- ``loss_fn(model, batch)``: snip and Hugging Face models.
* :mod:`snip.sensitivity.stats` -- rank correlations with bootstrap intervals, split-half
  reliability and the noise ceiling (validating a predictor against measured damage).
"""
from snip.sensitivity.estimate import Propagation, SensitivityConfig, measure
from snip.sensitivity.loss import LossContractError, LossFn, default_loss
from snip.sensitivity.table import (
    TABLE_VERSION,
    LayerEntry,
    Metric,
    Normalization,
    Raw,
    SensitivityTable,
    Terms,
    blend,
    normalize,
    synthetic_table,
)

__all__ = ["TABLE_VERSION", "LayerEntry", "LossContractError", "LossFn", "Metric",
           "Normalization", "Propagation", "Raw", "SensitivityConfig", "SensitivityTable",
           "Terms", "blend", "default_loss", "measure", "normalize", "synthetic_table"]
