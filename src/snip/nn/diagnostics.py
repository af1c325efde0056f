"""Diagnostics of the quantized GEMMs: how far the native FP8 path is from emulation.

Kept apart from `snip.nn.native` (the native path itself), which it measures through the whole
layer stack (`snip.nn.gemm`, `snip.nn.qlinear`): `native` then imports neither, and the
package's imports run one way, ``specs -> native -> gemm -> qlinear -> diagnostics``.
"""

from __future__ import annotations

import torch

from snip.nn.gemm import GemmConfig, quantized_linear
from snip.nn.native import sqnr_db
from snip.nn.qlinear import as_gemm_specs
from snip.nn.specs import GemmImpl


def native_sqnr(x: torch.Tensor, weight: torch.Tensor, specs, *, grad: torch.Tensor | None = None,
                seed: int = 0, strict: bool = True) -> dict[str, float]:
    """SQNR (dB) of the native GEMMs against the emulated ones for one layer and batch:
    ``{"fprop": y, "dgrad": dX, "wgrad": dW}``, emulation as the reference.  ``specs`` is a
    ``GemmSpecs``, a ``QuantSpec`` or a preset name; ``grad`` is ``dY`` (random when ``None``)."""
    specs = as_gemm_specs(specs)
    outs = {}
    if grad is None:
        g = torch.Generator().manual_seed(seed)
        grad = torch.randn(*x.shape[:-1], weight.shape[0], generator=g).to(x.device)
    for impl in GemmImpl:
        xi = x.detach().clone().requires_grad_(True)
        wi = weight.detach().clone().requires_grad_(True)
        cfg = GemmConfig(specs=specs, seed=seed, gemm=impl, strict=strict)
        y = quantized_linear(xi, wi, None, cfg)
        y.backward(grad)
        outs[impl] = (y.detach(), xi.grad, wi.grad)
    e, n = outs[GemmImpl.EMULATED], outs[GemmImpl.NATIVE]
    return {name: sqnr_db(a, b) for name, a, b in zip(("fprop", "dgrad", "wgrad"), e, n,
                                                       strict=True)}
