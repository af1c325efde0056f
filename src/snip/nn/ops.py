"""The quantized linear layer as ``torch.library`` custom ops: what ``torch.compile`` traces.

Under ``torch.compile`` a :class:`~snip.nn.QLinear` calls two opaque operators instead of the
autograd Function, joined by ``register_autograd``::

    snip::quantized_linear(x, weight, bias, config, out_dtype, step) -> (y, step)      fprop
    snip::quantized_linear_backward(dy, x, weight, config, out_dtype, step, need_x, need_w,
                                    bias_dtype) -> (dx, dw, db)              dgrad, wgrad

Dynamo and AOTAutograd see only their fake implementations (the output shapes and dtypes), so a
converted model compiles into whole graphs with no break at its layers, and Inductor fuses the
ops between them.  The real implementations are :func:`~snip.nn.gemm.hp_forward` and
:func:`~snip.nn.gemm.hp_backward`, the functions the eager Function runs for these settings, on
the same operands with the same seeds: compiled equals eager bit for bit.

What crosses the op boundary (ops take only tensors and primitives):

- ``config``: an ``int`` handle into a process-wide registry of
  :class:`~snip.nn.gemm.GemmConfig` (one per distinct layer setting, at step 0).  A setting
  that changes (a SNIP re-plan) is a new handle, and Dynamo recompiles the graph that holds it.
- ``step``: the layer's forward counter as a 0-d int64 tensor, so the counter that seeds
  stochastic rounding advances every step without a recompile.
- backward gets ``X`` and ``W`` in high precision (``SaveMode.HP``'s rule) and rebuilds what
  the eager forward would have kept (:func:`~snip.nn.gemm.hp_rebuilt`).

``SaveMode.ENCODED`` and ``GemmImpl.NATIVE`` are not taken through the ops (packed operands and
FP8 codes are not tensors an op can return); those layers keep one graph break per call.
"""

from __future__ import annotations

import dataclasses
import functools
import threading

import torch

from snip.nn.gemm import GemmConfig, hp_backward, hp_forward, hp_rebuilt

_LOCK = threading.Lock()
_CONFIGS: list[GemmConfig] = []
_HANDLES: dict[GemmConfig, int] = {}


def config_handle(cfg: GemmConfig) -> int:
    """The registry handle of ``cfg`` (its step is ignored: the op takes the step apart)."""
    cfg = cfg.at_step(0)
    with _LOCK:
        h = _HANDLES.get(cfg)
        if h is None:
            h = _HANDLES[cfg] = len(_CONFIGS)
            _CONFIGS.append(cfg)
    return h


@functools.cache
def _typed(handle: int, out_dtype: torch.dtype) -> GemmConfig:
    """The registered config with the call's output dtype, built once per pair."""
    return dataclasses.replace(_CONFIGS[handle], out_dtype=out_dtype)


def _config(handle: int, out_dtype: torch.dtype, step: torch.Tensor) -> GemmConfig:
    return _typed(handle, out_dtype).at_step(int(step))


@torch.library.custom_op("snip::quantized_linear", mutates_args=())
def quantized_linear_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                        config: int, out_dtype: torch.dtype, step: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """fprop of a quantized linear layer (``config``: :func:`config_handle`), and a copy of the
    step for backward (an op output: the partitioner cannot recompute it from a step tensor
    that the layer has advanced since)."""
    y = hp_forward(x, weight, bias, _config(config, out_dtype, step), False)[0]
    return y, step.clone()


@quantized_linear_op.register_fake
def _(x, weight, bias, config, out_dtype, step):
    return x.new_empty((*x.shape[:-1], weight.shape[0]), dtype=out_dtype), step.new_empty(())


@torch.library.custom_op("snip::quantized_linear_backward", mutates_args=())
def quantized_linear_backward_op(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                                 config: int, out_dtype: torch.dtype, step: torch.Tensor,
                                 need_x: bool, need_w: bool, bias_dtype: torch.dtype | None
                                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dgrad, wgrad and the bias gradient; an empty tensor stands for one not needed."""
    x2, w, kept = hp_rebuilt(x, weight, _config(config, out_dtype, step))
    grads = hp_backward(dy, x2, w, kept, x.shape, x.dtype, weight.dtype, bias_dtype, need_x,
                        need_w, bias_dtype is not None)
    return tuple(g if g is not None else dy.new_empty(0) for g in grads)


@quantized_linear_backward_op.register_fake
def _(dy, x, weight, config, out_dtype, step, need_x, need_w, bias_dtype):
    dx = x.new_empty(x.shape) if need_x else dy.new_empty(0)
    dw = weight.new_empty(weight.shape) if need_w else dy.new_empty(0)
    db = dy.new_empty(weight.shape[0], dtype=bias_dtype) if bias_dtype is not None \
        else dy.new_empty(0)
    return dx, dw, db


def _setup_context(ctx, inputs, output) -> None:
    x, weight, bias, config, out_dtype, _ = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.mark_non_differentiable(output[1])
    ctx.config, ctx.out_dtype = config, out_dtype
    ctx.has_bias = bias is not None
    ctx.bias_dtype = None if bias is None else bias.dtype


def _backward(ctx, dy: torch.Tensor, _: torch.Tensor | None):
    x, weight, step = ctx.saved_tensors
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    dx, dw, db = quantized_linear_backward_op(
        dy, x, weight, ctx.config, ctx.out_dtype, step, need_x, need_w,
        ctx.bias_dtype if need_b and ctx.has_bias else None)
    return (dx if need_x else None, dw if need_w else None,
            db if need_b and ctx.has_bias else None, None, None, None)


quantized_linear_op.register_autograd(_backward, setup_context=_setup_context)
