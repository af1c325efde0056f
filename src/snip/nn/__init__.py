"""Quantized training layers: per-GEMM formats for linear layers, and model conversion."""

from snip.nn.conv1d import QConv1D, is_conv1d
from snip.nn.convert import (
    DEFAULT_SKIP_NAMES,
    ResolvesToSpecs,
    bf16_gemms_idle,
    convert,
    disabled,
    is_linear_like,
    layer_seed,
    plain_forward,
    qlinear_layers,
    unconvert,
)
from snip.nn.diagnostics import native_sqnr
from snip.nn.gemm import (
    GemmConfig,
    SavedBytes,
    quantized_linear,
    weight_reusable,
)
from snip.nn.native import fp8_gemm_supported
from snip.nn.qlinear import QLinear, as_gemm_specs, saved_activation_bytes
from snip.nn.specs import GEMM_NAMES, Accum, Gemm, GemmImpl, GemmSpecs, SaveMode

__all__ = [
    "DEFAULT_SKIP_NAMES", "GEMM_NAMES", "Accum", "Gemm", "GemmConfig", "GemmImpl",
    "GemmSpecs", "fp8_gemm_supported", "native_sqnr",
    "QConv1D", "QLinear", "is_conv1d", "is_linear_like",
    "ResolvesToSpecs", "SaveMode", "SavedBytes",
    "as_gemm_specs", "bf16_gemms_idle", "convert", "disabled", "layer_seed", "plain_forward",
    "qlinear_layers",
    "quantized_linear", "saved_activation_bytes", "unconvert", "weight_reusable",
]
