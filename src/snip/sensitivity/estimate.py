"""Loss divergence and weight divergence per layer x GEMM x candidate format.

The full derivation is in ``docs/snip.md`` ("Sensitivity metrics"); the short version, for a
linear layer ``Y = X W^T`` with output gradient ``G = dL/dY`` and candidate format ``p`` whose
operand errors ``E^T = Q_p(T) - T`` we model as independent and zero-mean element-wise:

**Loss divergence (fprop).**  Second order in the operand errors, where independence leaves only
the diagonals of the operand Hessians::

    dL[l, p] = 1/2 sum_i (E^X_i)^2 h^X_i  +  1/2 sum_i (E^W_i)^2 h^W_i

``h^X``, ``h^W`` are Hutchinson estimates of ``diag(d^2 L / dX_l^2)`` and ``diag(d^2 L /
dW_l^2)`` from one *forward noise pass*: every layer's operands get Rademacher noise ``sigma z``
(``sigma`` = ``noise_scale`` x RMS of the operand), the backward is re-run, and
``h = z * (grad(perturbed) - grad(clean)) / sigma``.  Noise in other layers and the other
operand only adds zero-mean cross terms; ``noise_groups=k`` splits the layers into ``k``
passes (round robin) to cut those, at ``k`` times the cost.  (``first_order=True`` adds the
exact first-order term
``<G W, E^X> + <G^T X, E^W>``, which averages out over steps but not on one fixed batch.)

**Weight divergence (backward).**  The expected squared deviation of the next AdamW update,
``E ||a * dg||^2`` over every trainable parameter, with ``a`` the linearised Adam gain
(:mod:`snip.sensitivity.adam`).  Quantizing ``wgrad`` perturbs the layer's own gradient by
``E^G^T X + G^T E^X`` (errors along tokens), whose expected square is exact under independence::

    dW_wgrad[l, p] = sum_{m,k} a_{mk}^2 [ (E^G^2)^T X^2 + (G^2)^T (E^X^2) ]_{mk}

Quantizing ``dgrad`` perturbs ``dX_l`` by ``E^G W + G E^W`` (energy
``e = sum (E^G^2) (W^2) + sum (G^2) (E^W^2)``), and backpropagation carries that into every
upstream gradient linearly: ``dg_j = J_j dX``.  For isotropic error of the same energy,
``E ||a J dX||^2 = e / numel(X) * tr(J^T a^2 J)``, and the trace is measured by a *backward noise
pass*: inject Rademacher ``z`` as the gradient of ``X_l`` and read ``||a * J z||^2`` (layers that
share an input tensor share the pass)::

    dW_dgrad[l, p] = e[l, p] / numel(X_l) * ||a * J_{X_l} z||^2

Everything is averaged over ``micro_batches`` calibration batches and, under
``torch.distributed``, over ranks (all-reduce), so every rank builds the same table and plans
the same precision.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from snip.errors import UserError
from snip.formats import get_spec, quantize
from snip.nn.specs import Gemm
from snip.plan.cost import gemm_flops, linear_layers
from snip.sensitivity.adam import adam_summary, update_gain
from snip.sensitivity.probes import Capture, Noise, high_precision
from snip.sensitivity.table import (
    GEMMS,
    LayerEntry,
    Normalization,
    SensitivityTable,
    normalize,
)

BatchFn = Callable[[int], tuple[torch.Tensor, torch.Tensor]]
DEFAULT_CANDIDATES = ("fp8_e4m3_tile128", "fp4_e2m1_tile128")


@dataclass(frozen=True, kw_only=True)
class SensitivityConfig:
    """How one statistics cycle is measured."""

    candidates: tuple[str, ...] = DEFAULT_CANDIDATES
    micro_batches: int = 2
    noise_scale: float = 0.05
    normalization: Normalization = Normalization.SUM
    first_order: bool = False
    noise_groups: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "candidates", tuple(get_spec(c).name for c in self.candidates))
        object.__setattr__(self, "normalization", Normalization(self.normalization))
        if not self.candidates:
            raise UserError("SensitivityConfig.candidates is empty; give at least one preset")
        if isinstance(self.micro_batches, bool) or not isinstance(self.micro_batches, int) \
                or self.micro_batches < 1:
            raise UserError(f"micro_batches={self.micro_batches!r} must be a positive int")
        if isinstance(self.noise_groups, bool) or not isinstance(self.noise_groups, int) \
                or self.noise_groups < 1:
            raise UserError(f"noise_groups={self.noise_groups!r} must be a positive int (forward "
                            "noise passes per micro-batch; more passes = fewer cross terms)")
        if not 0 < self.noise_scale < 1:
            raise UserError(f"noise_scale={self.noise_scale!r} must be in (0, 1); "
                            "0.05 (5% of each operand's RMS) is a good default")


class _Sums:
    """Running sums of every scalar the table needs (so ranks can all-reduce one vector)."""

    def __init__(self) -> None:
        self.values: dict[tuple, float] = defaultdict(float)

    def add(self, key: tuple, value: torch.Tensor | float) -> None:
        self.values[key] += float(value)

    def reduce(self, count: int) -> dict[tuple, float]:
        keys = sorted(self.values, key=repr)
        vec = torch.tensor([self.values[k] for k in keys], dtype=torch.float64)
        world = 1
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            backend_dev = "cuda" if torch.distributed.get_backend() == "nccl" else "cpu"
            vec = vec.to(backend_dev)
            torch.distributed.all_reduce(vec)
            world = torch.distributed.get_world_size()
        return {k: float(v) / (count * world) for k, v in zip(keys, vec.cpu(), strict=True)}


def _rademacher(like: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    r = torch.randint(0, 2, like.shape, generator=gen, device="cpu", dtype=torch.int8)
    return (r.to(like.device, torch.float32) * 2 - 1)


def _rms(t: torch.Tensor) -> float:
    return float(t.detach().float().pow(2).mean().sqrt()) or 1.0


def _clean_pass(model: nn.Module, layers: dict[str, nn.Linear], params: list[nn.Parameter],
                x: torch.Tensor, y: torch.Tensor):
    cap = Capture(layers)
    with cap.attach():
        _, loss = model(x, y)
    names = list(layers)
    grads = torch.autograd.grad(loss, [cap.outputs[n] for n in names] + params,
                                retain_graph=True, allow_unused=True)
    out_grads = dict(zip(names, grads[:len(names)], strict=True))
    param_grads = list(grads[len(names):])
    return loss, cap, out_grads, param_grads


def _propagation_gains(cap: Capture, params: list[nn.Parameter], gains: list,
                       gen: torch.Generator) -> dict[str, float]:
    """``||a * J_X z||^2`` per distinct layer input ``X`` (one backward noise pass each)."""
    groups: dict[int, list[str]] = defaultdict(list)
    for n, x in cap.inputs.items():
        groups[id(x)].append(n)
    kappa = {}
    for members in groups.values():
        x = cap.inputs[members[0]]
        k = 0.0
        if x.requires_grad:
            vj = torch.autograd.grad(x, params, grad_outputs=_rademacher(x, gen).to(x.dtype),
                                     retain_graph=True, allow_unused=True)
            k = sum(float(((a * v.float()) ** 2).sum()) for a, v in zip(gains, vj, strict=True)
                    if v is not None)
        for n in members:
            kappa[n] = k
    return kappa


def _noise_pass(model: nn.Module, layers: dict[str, nn.Linear], cap: Capture,
                x: torch.Tensor, y: torch.Tensor, scale: float, gen: torch.Generator):
    """Perturbed operand gradients and the noise used: ``{name: (zx, sx, zw, sw, gx, gw)}``."""
    z = {}
    noise = {}
    for n, m in layers.items():
        xin = cap.inputs[n]
        zx, zw = _rademacher(xin, gen), _rademacher(m.weight, gen)
        sx, sw = scale * _rms(xin), scale * _rms(m.weight)
        z[n] = (zx, sx, zw, sw)
        noise[n] = Noise(x=sx * zx, w=sw * zw)
    cap2 = Capture(layers, noise=noise)
    with cap2.attach():
        _, loss = model(x, y)
    names = list(layers)
    grads = torch.autograd.grad(loss, [cap2.inputs[n] for n in names] +
                                [layers[n].weight for n in names], allow_unused=True)
    k = len(names)
    return {n: (*z[n], grads[i], grads[k + i]) for i, n in enumerate(names)}


def _err(t: torch.Tensor, spec, axis: int, grad: bool, gen: torch.Generator) -> torch.Tensor:
    rounding = spec.grad_rounding if grad else None
    return quantize(t, spec, axis=axis, rounding=rounding, generator=gen if grad else None) - t


def _layer_metrics(name: str, m: nn.Linear, x: torch.Tensor, g: torch.Tensor,
                   dw: torch.Tensor, gain, kappa: float, noisy: tuple, cfg: SensitivityConfig,
                   gen: torch.Generator, sums: _Sums) -> None:
    """Add one micro-batch's divergences of layer ``name`` for every candidate to ``sums``.

    ``gen`` drives the stochastic rounding of the gradient operands; it lives on the model's
    device (``quantize`` draws its uniforms there).
    """
    zx, sx, zw, sw, gx2, gw2 = noisy
    w = m.weight.detach().float()
    x2 = x.detach().float().reshape(-1, w.shape[1])
    g2 = g.detach().float().reshape(-1, w.shape[0])
    dx = g2 @ w
    hx = (zx.reshape(x2.shape) * (gx2.detach().float().reshape(x2.shape) - dx) / sx
          if gx2 is not None else torch.zeros_like(x2))
    hw = zw * (gw2.detach().float() - dw) / sw if gw2 is not None else torch.zeros_like(w)
    a2 = gain * gain if isinstance(gain, torch.Tensor) else float(gain) ** 2
    for key, v in (("x", x2), ("w", w), ("y", x2 @ w.T), ("dy", g2), ("dx", dx), ("dw", dw)):
        sums.add((name, "stat", key + "_norm"), v.norm())
    for c in cfg.candidates:
        spec = get_spec(c)
        ex, ew = _err(x2, spec, -1, False, gen), _err(w, spec.for_weight(), -1, False, gen)
        ewd = _err(w, spec.for_weight(), 0, False, gen)
        egd, egw = _err(g2, spec, -1, True, gen), _err(g2, spec, 0, True, gen)
        exw = _err(x2, spec, 0, False, gen)
        dl = 0.5 * ((ex * ex * hx).sum() + (ew * ew * hw).sum())
        if cfg.first_order:
            dl = dl + (dx * ex).sum() + (dw * ew).sum()
        own = (a2 * ((egw * egw).T @ (x2 * x2) + (g2 * g2).T @ (exw * exw))).sum()
        energy = (egd * egd).sum(0) @ (w * w).sum(1) + (g2 * g2).sum(0) @ (ewd * ewd).sum(1)
        sums.add((name, Gemm.FPROP.value, c, "dl"), dl)
        sums.add((name, Gemm.WGRAD.value, c, "dw"), own)
        sums.add((name, Gemm.DGRAD.value, c, "dw"), energy / x2.numel() * kappa)
        for op, e, t in (("x", ex, x2), ("w", ew, w), ("dy", egd, g2)):
            sums.add((name, "rel", c, op), e.norm() / t.norm().clamp_min(1e-30))


def _one_batch(model: nn.Module, layers: dict[str, nn.Linear], params: list[nn.Parameter],
               optimizer, x: torch.Tensor, y: torch.Tensor, cfg: SensitivityConfig,
               gen: torch.Generator, err_gen: torch.Generator, sums: _Sums) -> None:
    """``gen`` (CPU) draws the Rademacher noise, ``err_gen`` (model device) the rounding."""
    loss, cap, out_grads, param_grads = _clean_pass(model, layers, params, x, y)
    sums.add(("loss",), loss.detach())
    gains = [update_gain(optimizer, p, g) if g is not None else 0.0
             for p, g in zip(params, param_grads, strict=True)]
    kappa = _propagation_gains(cap, params, gains, gen)
    names = list(layers)
    noisy = {}
    for k in range(min(cfg.noise_groups, len(names))):
        group = {n: layers[n] for n in names[k::cfg.noise_groups]}
        noisy.update(_noise_pass(model, group, cap, x, y, cfg.noise_scale, gen))
    index = {id(p): i for i, p in enumerate(params)}
    for n, m in layers.items():
        i = index[id(m.weight)]
        dw = param_grads[i].detach().float() if param_grads[i] is not None else \
            torch.zeros_like(m.weight, dtype=torch.float32)
        _layer_metrics(n, m, cap.inputs[n], out_grads[n], dw, gains[i], kappa[n], noisy[n],
                       cfg, err_gen, sums)
    del loss, cap


def measure(model: nn.Module, batch_fn: BatchFn, *, optimizer=None,
            config: SensitivityConfig | None = None, step: int | None = None,
            layers: Sequence[str] | None = None) -> SensitivityTable:
    """Run the statistics cycle on ``config.micro_batches`` batches and build the table.

    ``batch_fn(i)`` returns the i-th (tokens, targets) calibration batch; ``optimizer`` supplies
    the AdamW state (without it the update gain is 1, i.e. raw gradient deviation).  Weights,
    ``.grad`` fields and optimizer state are not modified.
    """
    cfg = config or SensitivityConfig()
    all_linear = linear_layers(model)
    names = list(layers) if layers is not None else list(all_linear)
    missing = [n for n in names if n not in all_linear]
    if missing:
        raise UserError(f"{missing[0]!r} is not a linear layer of this model")
    chosen = {n: all_linear[n] for n in names}
    params = [p for p in model.parameters() if p.requires_grad]
    device = next(model.parameters()).device
    gen = torch.Generator(device="cpu").manual_seed(cfg.seed)
    # Stochastic rounding draws on the operands' device; on CPU both streams are one generator.
    err_gen = gen if device.type == "cpu" else \
        torch.Generator(device=device).manual_seed(cfg.seed)
    sums, tokens = _Sums(), 1
    with high_precision(model):
        for i in range(cfg.micro_batches):
            x, y = (t.to(device) for t in batch_fn(i))
            tokens = int(x.numel())
            _one_batch(model, chosen, params, optimizer, x, y, cfg, gen, err_gen, sums)
    avg = sums.reduce(cfg.micro_batches)
    weight_sq = float(sum(p.detach().float().pow(2).sum() for p in params))
    return _build_table(model, chosen, optimizer, cfg, avg, tokens, step, weight_sq)


def _build_table(model: nn.Module, layers: dict[str, nn.Linear], optimizer,
                 cfg: SensitivityConfig, avg: dict[tuple, float], tokens: int,
                 step: int | None, weight_sq: float) -> SensitivityTable:
    raw = {n: {g: {c: (avg.get((n, g, c, "dl"), 0.0), avg.get((n, g, c, "dw"), 0.0))
                   for c in cfg.candidates} for g in GEMMS} for n in layers}
    loss = avg[("loss",)]
    metrics = normalize(raw, cfg.normalization, loss=loss, weight_sq=weight_sq)
    flops = gemm_flops(model, tokens, layers)
    entries = {}
    for n, m in layers.items():
        stats = {k[2]: v for k, v in avg.items() if k[:2] == (n, "stat")}
        stats["adam"] = adam_summary(optimizer, m.weight)
        rel = {c: {op: avg[(n, "rel", c, op)] for op in ("x", "w", "dy")} for c in cfg.candidates}
        entries[n] = LayerEntry(in_features=m.in_features, out_features=m.out_features,
                                flops={g.value: float(f) for g, f in flops[n].items()},
                                metrics=metrics[n], rel_err=rel, stats=stats)
    return SensitivityTable(candidates=cfg.candidates, layers=entries, tokens=tokens, loss=loss,
                            step=step, normalization=cfg.normalization,
                            meta={"micro_batches": cfg.micro_batches,
                                  "noise_scale": cfg.noise_scale, "first_order": cfg.first_order,
                                  "noise_groups": cfg.noise_groups,
                                  "weight_sq": weight_sq})
