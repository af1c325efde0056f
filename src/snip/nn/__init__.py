"""Quantized training layers: per-GEMM formats for linear layers, and model conversion."""

from snip.nn.specs import Gemm, GemmSpecs

__all__ = ["Gemm", "GemmSpecs"]
