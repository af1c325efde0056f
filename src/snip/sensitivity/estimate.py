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
``E ||a * dg||^2`` over every trainable parameter (``a``: the linearised Adam gain of
:mod:`snip.sensitivity.adam`), and the same deviation in nats, ``E sum omega dg^2`` with
``omega = lr / (4 (sqrt(v_hat) + eps))`` (the stationary excess loss that gradient noise causes
under Adam).  Quantizing ``wgrad`` perturbs the layer's own gradient by exactly
``E^G^T Q(X) + G^T E^X`` (operands along tokens); the stochastic ``E^G`` is independent and
zero-mean, the RNE ``E^X`` is fixed, so the expectation is exact::

    dW_wgrad[l, p] = sum a^2 [ (E^G^2)^T Q(X)^2 ]  +  sum a^2 (G^T E^X)^2

Quantizing ``dgrad`` perturbs ``dX_l`` by ``E^G Q(W) + G E^W``, which backpropagation carries
into every upstream gradient; :mod:`snip.sensitivity.propagate` measures that with an
*error-shaped probe* ``(s * E^G) Q(W) + G E^W`` (random signs ``s``), all layers in one backward
pass attributed by one forward-mode difference (``propagation="joint"``), or one VJP per layer
(``"exact"``).

Everything is averaged over ``calib_batches`` calibration batches and, under
``torch.distributed``, over ranks (all-reduce), so every rank builds the same table and plans
the same precision.  Batches come from ``batch_fn(batch_offset + i)``: the controller moves the
offset every cycle, so each cycle sees fresh data.  ``loss_fn(model, batch)`` turns a batch into
the scalar loss (:mod:`snip.sensitivity.loss`; Hugging Face models work out of the box).
"""

from __future__ import annotations

import enum
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from snip.errors import UserError
from snip.formats import QuantSpec, Scaling, get_spec, quantize
from snip.nn.specs import Gemm
from snip.plan.cost import gemm_flops, linear_layers
from snip.sensitivity import propagate
from snip.sensitivity.adam import adam_summary, nats_weight, update_gain
from snip.sensitivity.loss import (
    Batch,
    BatchFn,
    LossFn,
    batch_to,
    batch_tokens,
    default_loss,
    take_rows,
)
from snip.sensitivity.probes import Capture, Noise, high_precision
from snip.sensitivity.table import (
    GEMMS,
    LayerEntry,
    Normalization,
    Raw,
    SensitivityTable,
    Terms,
    normalize,
)

DEFAULT_CANDIDATES = ("fp8_e4m3_tile128", "fp4_e2m1_tile128")


class Propagation(enum.Enum):
    """How the dgrad probe reaches upstream parameters (:mod:`snip.sensitivity.propagate`)."""

    JOINT = "joint"   # one backward + one forward per weight, for all layers
    EXACT = "exact"   # one VJP per layer and candidate (reference)


@dataclass(frozen=True, kw_only=True)
class SensitivityConfig:
    """How one statistics cycle is measured."""

    candidates: tuple[str, ...] = DEFAULT_CANDIDATES
    calib_batches: int = 1
    noise_scale: float = 0.05
    normalization: Normalization = Normalization.NATS
    terms: Terms = Terms.BOTH
    propagation: Propagation = Propagation.JOINT
    first_order: bool = False
    noise_groups: int = 1
    calib_rows: int | None = None    # use only the first ``calib_rows`` sequences of each batch
    step_tokens: int | None = None   # tokens per optimizer step (None: the whole batch's)
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "candidates", tuple(get_spec(c).name for c in self.candidates))
        object.__setattr__(self, "normalization", Normalization(self.normalization))
        object.__setattr__(self, "terms", Terms(self.terms))
        object.__setattr__(self, "propagation", Propagation(self.propagation))
        if not self.candidates:
            raise UserError("SensitivityConfig.candidates is empty; give at least one preset")
        if isinstance(self.calib_batches, bool) or not isinstance(self.calib_batches, int) \
                or self.calib_batches < 1:
            raise UserError(f"calib_batches={self.calib_batches!r} must be a positive int")
        if isinstance(self.noise_groups, bool) or not isinstance(self.noise_groups, int) \
                or self.noise_groups < 1:
            raise UserError(f"noise_groups={self.noise_groups!r} must be a positive int (forward "
                             "noise passes per micro-batch; more passes = fewer cross terms)")
        for name in ("calib_rows", "step_tokens"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise UserError(f"{name}={v!r} must be a positive int or None")
        if not 0 < self.noise_scale < 1:
            raise UserError(f"noise_scale={self.noise_scale!r} must be in (0, 1); "
                            "0.05 (5% of each operand's RMS) is a good default")

    def steps(self, n_layers: int) -> int:
        """How many times :func:`measure` of ``n_layers`` layers calls its ``done``: per
        calibration batch the clean pass, each noise pass, each layer's metrics and the
        propagation."""
        return self.calib_batches * (2 + min(self.noise_groups, n_layers) + n_layers)


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


@dataclass
class _Cycle:
    """What stays fixed during one statistics cycle."""

    model: nn.Module
    layers: dict[str, nn.Linear]
    params: list[nn.Parameter]
    optimizer: torch.optim.Optimizer | None
    cfg: SensitivityConfig
    loss_fn: LossFn
    gen: torch.Generator        # CPU: Rademacher noise and probe signs
    err_gen: torch.Generator    # model device: stochastic rounding
    weight_errors: dict[tuple[str, str], tuple[torch.Tensor, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class _Clean:
    """The clean (unperturbed) pass of one micro-batch."""

    loss: torch.Tensor
    cap: Capture
    out_grads: dict[str, torch.Tensor | None]
    param_grads: list[torch.Tensor | None]


def _rademacher(like: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    r = torch.randint(0, 2, like.shape, generator=gen, device="cpu", dtype=torch.int8)
    return (r.to(like.device, torch.float32) * 2 - 1)


def _rms(t: torch.Tensor) -> float:
    return float(t.detach().float().pow(2).mean().sqrt()) or 1.0


def _clean_pass(c: _Cycle, batch: Batch) -> _Clean:
    cap = Capture(c.layers)
    with cap.attach():
        loss = c.loss_fn(c.model, batch)
    names = list(c.layers)
    grads = torch.autograd.grad(loss, [cap.outputs[n] for n in names] + c.params,
                                retain_graph=True, allow_unused=True)
    return _Clean(loss=loss, cap=cap, out_grads=dict(zip(names, grads[:len(names)], strict=True)),
                  param_grads=list(grads[len(names):]))


def _noise_pass(c: _Cycle, layers: dict[str, nn.Linear], cap: Capture, batch: Batch) -> dict:
    """Hutchinson: perturbed operand gradients and noise, ``{name: (zx, sx, zw, sw, gx, gw)}``."""
    z, noise = {}, {}
    for n, m in layers.items():
        xin = cap.inputs[n]
        zx, zw = _rademacher(xin, c.gen), _rademacher(m.weight, c.gen)
        sx, sw = c.cfg.noise_scale * _rms(xin), c.cfg.noise_scale * _rms(m.weight)
        z[n] = (zx, sx, zw, sw)
        noise[n] = Noise(x=sx * zx, w=sw * zw)
    cap2 = Capture(layers, noise=noise)
    with cap2.attach():
        loss = c.loss_fn(c.model, batch)
    names = list(layers)
    grads = torch.autograd.grad(loss, [cap2.inputs[n] for n in names] +
                                [layers[n].weight for n in names], allow_unused=True)
    k = len(names)
    return {n: (*z[n], grads[i], grads[k + i]) for i, n in enumerate(names)}


@dataclass(frozen=True)
class OperandCurvature:
    """Hutchinson estimates of the Hessian diagonals w.r.t. one layer's input and weight."""

    x: torch.Tensor  # (tokens, in_features)
    w: torch.Tensor  # (out_features, in_features)


def hutchinson(model: nn.Module, batch: Batch, *, samples: int = 1, noise_scale: float = 0.05,
               loss_fn: LossFn | None = None, seed: int = 0) -> dict[str, OperandCurvature]:
    """``diag(d^2 L / dX_l^2)`` and ``diag(d^2 L / dW_l^2)`` for every linear layer, averaged
    over ``samples`` forward noise passes (what :func:`measure` uses, exposed for checking)."""
    gen = torch.Generator().manual_seed(seed)
    c = _Cycle(model=model, layers=linear_layers(model),
               params=[p for p in model.parameters() if p.requires_grad], optimizer=None,
               cfg=SensitivityConfig(noise_scale=noise_scale), loss_fn=loss_fn or default_loss,
               gen=gen, err_gen=gen)
    clean = _clean_pass(c, batch)
    out: dict[str, OperandCurvature] = {}
    for _ in range(samples):
        noisy = _noise_pass(c, c.layers, clean.cap, batch)
        for n, m in c.layers.items():
            w = m.weight.detach().float()
            x2 = clean.cap.inputs[n].detach().float().reshape(-1, w.shape[1])
            g2 = clean.out_grads[n].detach().float().reshape(-1, w.shape[0])
            hx, hw = _curvature(noisy[n], x2, w, g2 @ w, g2.T @ x2)
            prev = out.get(n)
            out[n] = OperandCurvature(x=hx / samples + (prev.x if prev else 0),
                                      w=hw / samples + (prev.w if prev else 0))
    return out


def _err(t: torch.Tensor, spec: QuantSpec, axis: int, grad: bool,
         gen: torch.Generator) -> torch.Tensor:
    rounding = spec.grad_rounding if grad else None
    return quantize(t, spec, axis=axis, rounding=rounding, generator=gen if grad else None) - t


def _weight_errors(c: _Cycle, name: str, cand: str) -> tuple[torch.Tensor, ...]:
    """``(E^W fprop, Q(W) dgrad, E^W dgrad)``: the weight is fixed for the whole cycle."""
    key = (name, cand)
    if key not in c.weight_errors:
        w = c.layers[name].weight.detach().float()
        spec = get_spec(cand).for_weight()
        ewd = _err(w, spec, 0, False, c.err_gen)
        # 2-D blocks, one tensor scale or none: quant(W^T) == quant(W)^T, one pass serves both.
        symmetric = spec.scaling in (Scaling.BLOCK2D, Scaling.TENSOR, Scaling.NONE) \
            and not spec.hadamard
        ew = ewd if symmetric else _err(w, spec, -1, False, c.err_gen)
        c.weight_errors[key] = (ew, w + ewd, ewd)
    return c.weight_errors[key]


def _curvature(noisy: tuple, x2: torch.Tensor, w: torch.Tensor, dx: torch.Tensor,
               dw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    zx, sx, zw, sw, gx2, gw2 = noisy
    hx = (zx.reshape(x2.shape) * (gx2.detach().float().reshape(x2.shape) - dx) / sx
          if gx2 is not None else torch.zeros_like(x2))
    hw = zw * (gw2.detach().float() - dw) / sw if gw2 is not None else torch.zeros_like(w)
    return hx, hw


def _layer_metrics(c: _Cycle, name: str, x: torch.Tensor, g: torch.Tensor, dw: torch.Tensor,
                   weights: Mapping[str, torch.Tensor | float], noisy: tuple, source: str,
                   sums: _Sums) -> list[propagate.Probe]:
    """Add one micro-batch's fprop and wgrad divergences of layer ``name`` to ``sums`` and
    return its dgrad probes (one per candidate) for :mod:`snip.sensitivity.propagate`."""
    w = c.layers[name].weight.detach().float()
    x2 = x.detach().float().reshape(-1, w.shape[1])
    g2 = g.detach().float().reshape(-1, w.shape[0])
    dx = g2 @ w
    hx, hw = _curvature(noisy, x2, w, dx, dw)
    norms = {}
    for key, v in (("x", x2), ("w", w), ("dy", g2), ("dx", dx), ("dw", dw)):
        norms[key] = float(v.norm())
        sums.add((name, "stat", key + "_norm"), norms[key])
    probes, signs = [], propagate.random_signs(g2, c.gen)
    for cand in c.cfg.candidates:
        spec = get_spec(cand)
        ew, wqd, ewd = _weight_errors(c, name, cand)
        ex = _err(x2, spec, -1, False, c.err_gen)
        egd, egw = _err(g2, spec, -1, True, c.err_gen), _err(g2, spec, 0, True, c.err_gen)
        exw = _err(x2, spec, 0, False, c.err_gen)
        dl = 0.5 * (torch.dot((ex * ex).reshape(-1), hx.reshape(-1))
                    + torch.dot((ew * ew).reshape(-1), hw.reshape(-1)))
        if c.cfg.first_order:
            dl = dl + (dx * ex).sum() + (dw * ew).sum()
        sums.add((name, Gemm.FPROP.value, cand, "dl"), dl)
        xq2, fixed = (x2 + exw).square_(), g2.T @ exw
        energy = torch.addmm(fixed.square_(), egw.square_().T, xq2)  # E^G^2' Q(X)^2 + fixed^2
        for k, om in weights.items():
            val = torch.dot(om.reshape(-1).float(), energy.reshape(-1)) \
                if torch.is_tensor(om) and om.numel() == energy.numel() else (om * energy).sum()
            sums.add((name, Gemm.WGRAD.value, cand, k), val)
        probes.append(propagate.Probe(layer=name, candidate=cand, source=source,
                                      vector=propagate.shaped_probe(g2, egd, wqd, ewd, signs)))
        for op, e in (("x", ex), ("w", ew), ("dy", egd)):
            sums.add((name, "rel", cand, op), float(e.norm()) / max(norms[op], 1e-30))
    return probes


def _sources(cap: Capture) -> dict[str, str]:
    """Layer -> first layer reading the same input tensor (q/k/v and gate/up share one)."""
    first: dict[int, str] = {}
    return {n: first.setdefault(id(x), n) for n, x in cap.inputs.items()}


def _inputs_at(c: _Cycle, batch: Batch, sources: Sequence[str]):
    layers = {n: c.layers[n] for n in sources}

    def run() -> dict[str, torch.Tensor]:
        cap = Capture(layers)
        with cap.attach(), torch.no_grad():
            c.loss_fn(c.model, batch)
        return {n: cap.inputs[n] for n in sources}
    return run


def _nothing() -> None:
    pass


def _one_batch(c: _Cycle, batch: Batch, sums: _Sums, done: Callable[[], None]) -> None:
    t0 = time.perf_counter()
    clean = _clean_pass(c, batch)
    sums.add(("seconds", "clean_pass"), time.perf_counter() - t0)
    done()
    sums.add(("loss",), clean.loss.detach())
    grads = clean.param_grads
    gains = [update_gain(c.optimizer, p, g) if g is not None else 0.0
             for p, g in zip(c.params, grads, strict=True)]
    weights = {"dw": [a * a for a in gains],
               "dwn": [nats_weight(c.optimizer, p, g) if g is not None else 0.0
                       for p, g in zip(c.params, grads, strict=True)]}
    names = list(c.layers)
    noisy = {}
    for k in range(min(c.cfg.noise_groups, len(names))):
        group = {n: c.layers[n] for n in names[k::c.cfg.noise_groups]}
        noisy.update(_noise_pass(c, group, clean.cap, batch))
        done()
    index = {id(p): i for i, p in enumerate(c.params)}
    sources = _sources(clean.cap)
    probes = []
    for n, m in c.layers.items():
        i = index[id(m.weight)]
        dw = grads[i].detach().float() if grads[i] is not None else \
            torch.zeros_like(m.weight, dtype=torch.float32)
        per_param = {k: v[i] for k, v in weights.items()}
        probes += _layer_metrics(c, n, clean.cap.inputs[n], clean.out_grads[n], dw, per_param,
                                 noisy[n], sources[n], sums)
        sums.add((n, "stat", "y_norm"), clean.cap.outputs[n].detach().float().norm())
        done()
    inputs = {s: clean.cap.inputs[s] for s in set(sources.values())}
    if c.cfg.propagation is Propagation.EXACT:
        prop = propagate.exact(probes, inputs, c.params, weights)
    else:
        prop = propagate.joint(probes, inputs, c.params, weights,
                               _inputs_at(c, batch, sorted(inputs)), c.gen)
    for (n, cand), p in prop.items():
        for k, v in p.energy.items():
            sums.add((n, Gemm.DGRAD.value, cand, k), v)
    done()


def measure(model: nn.Module, batch_fn: BatchFn, *, optimizer=None,
            config: SensitivityConfig | None = None, step: int | None = None,
            layers: Sequence[str] | None = None, loss_fn: LossFn | None = None,
            batch_offset: int = 0, done: Callable[[], None] | None = None) -> SensitivityTable:
    """Run the statistics cycle on ``config.calib_batches`` batches and build the table.

    ``batch_fn(batch_offset + i)`` returns the i-th calibration batch; ``loss_fn(model,
    batch)`` its scalar loss (default: :func:`snip.sensitivity.loss.default_loss`).
    ``optimizer`` supplies the AdamW state (without it the update gain is 1).  Weights,
    ``.grad`` fields and optimizer state are not modified.  ``done`` is called as the work
    advances, ``config.steps(len(layers))`` times in all (progress).
    """
    cfg = config or SensitivityConfig()
    all_linear = linear_layers(model)
    names = list(layers) if layers is not None else list(all_linear)
    missing = [n for n in names if n not in all_linear]
    if missing:
        raise UserError(f"{missing[0]!r} is not a linear layer of this model")
    device = next(model.parameters()).device
    gen = torch.Generator(device="cpu").manual_seed(cfg.seed)
    # Stochastic rounding draws on the operands' device; on CPU both streams are one generator.
    err_gen = gen if device.type == "cpu" else \
        torch.Generator(device=device).manual_seed(cfg.seed)
    c = _Cycle(model=model, layers={n: all_linear[n] for n in names},
               params=[p for p in model.parameters() if p.requires_grad], optimizer=optimizer,
               cfg=cfg, loss_fn=loss_fn or default_loss, gen=gen, err_gen=err_gen)
    sums, tokens, full = _Sums(), 1, 1
    with high_precision(model):
        for i in range(cfg.calib_batches):
            whole = batch_fn(batch_offset + i)
            batch = batch_to(take_rows(whole, cfg.calib_rows), device)
            tokens, full = batch_tokens(batch), batch_tokens(whole)
            _one_batch(c, batch, sums, done or _nothing)
    avg = sums.reduce(cfg.calib_batches)
    weight_sq = float(sum(p.detach().float().pow(2).sum() for p in c.params))
    table = _build_table(c, avg, tokens, cfg.step_tokens or full, step, weight_sq, batch_offset)
    table.meta["calib_batch_tokens"] = full
    return table


def _build_table(c: _Cycle, avg: dict[tuple, float], tokens: int, step_tokens: int,
                 step: int | None, weight_sq: float, batch_offset: int) -> SensitivityTable:
    cfg = c.cfg
    # Gradient-noise energy falls like 1/tokens: express it for one optimizer step.
    r = tokens / step_tokens
    raw = {n: {g: {k: Raw(avg.get((n, g, k, "dl"), 0.0), r * avg.get((n, g, k, "dw"), 0.0),
                          r * avg.get((n, g, k, "dwn"), 0.0))
                   for k in cfg.candidates} for g in GEMMS} for n in c.layers}
    loss = avg[("loss",)]
    metrics = normalize(raw, cfg.normalization, loss=loss, weight_sq=weight_sq, terms=cfg.terms)
    flops = gemm_flops(c.model, tokens, c.layers)
    entries = {}
    by_layer: dict[str, dict[str, float]] = defaultdict(dict)
    for k, v in avg.items():
        if len(k) == 3 and k[1] == "stat":
            by_layer[k[0]][k[2]] = v
    for n, m in c.layers.items():
        stats = dict(by_layer[n])
        stats["adam"] = adam_summary(c.optimizer, m.weight)
        rel = {k: {op: avg[(n, "rel", k, op)] for op in ("x", "w", "dy")} for k in cfg.candidates}
        entries[n] = LayerEntry(in_features=m.in_features, out_features=m.out_features,
                                flops={g.value: float(f) for g, f in flops[n].items()},
                                metrics=metrics[n], rel_err=rel, stats=stats)
    return SensitivityTable(candidates=cfg.candidates, layers=entries, tokens=tokens, loss=loss,
                            step=step, normalization=cfg.normalization, terms=cfg.terms,
                            meta={"calib_batches": cfg.calib_batches, "batch_offset": batch_offset,
                                  "calib_rows": cfg.calib_rows, "step_tokens": step_tokens,
                                  "noise_scale": cfg.noise_scale, "first_order": cfg.first_order,
                                  "noise_groups": cfg.noise_groups,
                                  "propagation": cfg.propagation.value,
                                  "clean_pass_seconds": avg[("seconds", "clean_pass")],
                                  "weight_sq": weight_sq})
