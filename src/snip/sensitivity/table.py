"""``SensitivityTable``: what the planner knows about each linear layer, as versioned JSON.

One table is the output of one statistics cycle (:mod:`snip.sensitivity.estimate`) and the input
of the planner (:func:`snip.planner.solve`).  For every linear layer ``l`` it stores

* its shape and the FLOPs of each GEMM (``2 T K M`` for ``T`` tokens, as in
  :func:`snip.plan.gemm_flops`);
* the Frobenius-norm statistics of one high-precision step (inputs, weights, outputs, output
  gradients, input gradients, weight gradients) and the AdamW state summary;
* the relative quantization error ``||Q_p(T) - T|| / ||T||`` of each operand ``T`` for each
  candidate format ``p`` (the local-error baseline reads these);
* per GEMM ``g`` and candidate ``p`` a :class:`Metric`: the raw loss divergence ``dL`` (forward,
  nats), the raw weight divergence ``dW`` (backward, squared update deviation) and their
  normalised forms, which are what the ILP adds up.

Which GEMM carries which metric (docs/snip.md derives this): quantizing ``fprop`` perturbs the
loss (``dL``); quantizing ``wgrad`` perturbs this layer's own weight gradient and ``dgrad``
perturbs every upstream weight gradient (both ``dW``).  A per-layer decision sums the three.

Normalisation (:class:`Normalization`):

* ``SUM`` (the previous default; :func:`normalize`'s default):
  ``dL_hat = dL / sum_l max_p dL_l``, ``dW_hat = dW / sum_{l,g} max_p dW_{l,g}`` -- each metric
  sums to 1 over the model at its worst candidate, so the unweighted objective
  ``dL_hat + dW_hat`` weighs forward and backward damage equally.
* ``RELATIVE``: ``dL / L`` (relative loss increase) and ``dW / ||theta||^2`` (relative drift).
* ``NATS`` (what :func:`snip.sensitivity.measure` uses by default): both metrics already in
  nats of training loss -- ``dL`` and ``dW_nats``, the stationary excess loss that the backward
  GEMM's gradient noise causes under Adam (:func:`snip.sensitivity.adam.nats_weight`) --
  divided by *one* common constant ``Z = sum_{l,g} max_p (dL + dW_nats)``, so the exchange rate
  between the two is physical, not an arbitrary 1:1 of separately normalised sums.

:class:`Terms` selects what the objective adds (``BOTH``; ``LOSS`` or ``WEIGHT`` alone for the
ablation).  :func:`blend` mixes two tables (the controller's exponential moving average), so a
plan does not hinge on one noisy cycle.

Negative raw estimates (the curvature estimate is stochastic) are clamped to zero when
normalising; the raw values are kept as measured.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from snip import atomic, jsonfile
from snip.errors import UserError
from snip.nn.specs import GEMM_NAMES, Gemm

TABLE_VERSION = 1
GEMMS = GEMM_NAMES


class Normalization(enum.Enum):
    SUM = "sum"
    RELATIVE = "relative"
    NATS = "nats"


class Terms(enum.Enum):
    """Which divergences enter the planner's objective (``LOSS``/``WEIGHT``: ablations)."""

    BOTH = "both"
    LOSS = "loss"
    WEIGHT = "weight"


@dataclass(frozen=True)
class Raw:
    """Raw divergences of one GEMM at one candidate, before normalisation."""

    loss_div: float = 0.0          # nats (fprop only)
    weight_div: float = 0.0        # squared update deviation E||a dg||^2 (dgrad, wgrad)
    weight_div_nats: float = 0.0   # stationary excess loss in nats (dgrad, wgrad)


@dataclass(frozen=True, kw_only=True)
class Metric:
    """Divergences of one GEMM of one layer at one candidate format."""

    loss_div: float = 0.0
    weight_div: float = 0.0
    loss_div_norm: float = 0.0
    weight_div_norm: float = 0.0
    weight_div_nats: float = 0.0

    @property
    def objective(self) -> float:
        """What the ILP minimises: normalised loss plus normalised weight divergence."""
        return self.loss_div_norm + self.weight_div_norm

    def to_dict(self) -> dict[str, float]:
        return {"loss_div": self.loss_div, "weight_div": self.weight_div,
                "loss_div_norm": self.loss_div_norm, "weight_div_norm": self.weight_div_norm,
                "weight_div_nats": self.weight_div_nats}

    @property
    def raw(self) -> Raw:
        return Raw(self.loss_div, self.weight_div, self.weight_div_nats)


@dataclass(frozen=True, kw_only=True)
class LayerEntry:
    """Everything recorded about one linear layer."""

    in_features: int
    out_features: int
    flops: dict[str, float]
    metrics: dict[str, dict[str, Metric]]  # gemm -> candidate -> Metric
    rel_err: dict[str, dict[str, float]] = field(default_factory=dict)  # cand -> operand -> err
    stats: dict[str, Any] = field(default_factory=dict)

    def metric(self, gemm: Gemm | str, candidate: str) -> Metric:
        g = Gemm(gemm).value
        try:
            return self.metrics[g][candidate]
        except KeyError:
            raise UserError(f"sensitivity table has no {g} metric for candidate {candidate!r}; "
                            f"measured candidates: {sorted(self.metrics.get(g, {}))}") from None

    @property
    def params(self) -> int:
        return self.in_features * self.out_features

    def to_dict(self) -> dict:
        return {"in_features": self.in_features, "out_features": self.out_features,
                "flops": dict(self.flops), "stats": self.stats, "rel_err": self.rel_err,
                "metrics": {g: {c: m.to_dict() for c, m in cs.items()}
                            for g, cs in self.metrics.items()}}

    @classmethod
    def from_dict(cls, name: str, d: Mapping) -> LayerEntry:
        try:
            return cls(in_features=int(d["in_features"]), out_features=int(d["out_features"]),
                       flops={g: float(d["flops"][g]) for g in GEMMS},
                       metrics={g: {c: Metric(**m) for c, m in d["metrics"][g].items()}
                                for g in GEMMS},
                       rel_err=dict(d.get("rel_err", {})), stats=dict(d.get("stats", {})))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            what = f"missing {e}" if isinstance(e, KeyError) else f"{type(e).__name__}: {e}"
            raise UserError(f"sensitivity table layer {name!r} is malformed ({what}); "
                            f"regenerate it with this version of snip") from None


@dataclass(frozen=True, kw_only=True)
class SensitivityTable:
    """Per layer, per GEMM, per candidate format divergences (see the module docstring)."""

    candidates: tuple[str, ...]
    layers: dict[str, LayerEntry]
    tokens: int = 1
    loss: float = float("nan")
    step: int | None = None
    normalization: Normalization = Normalization.SUM
    terms: Terms = Terms.BOTH
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "candidates", tuple(self.candidates))
        object.__setattr__(self, "normalization", Normalization(self.normalization))
        object.__setattr__(self, "terms", Terms(self.terms))
        if not self.layers:
            raise UserError("a sensitivity table needs at least one layer")
        for name, entry in self.layers.items():
            for c in self.candidates:
                for g in GEMMS:
                    entry.metric(g, c)  # raises naming the missing candidate
            if set(entry.flops) != set(GEMMS):
                raise UserError(f"layer {name!r}: flops must have keys {GEMMS}")

    @property
    def names(self) -> list[str]:
        return list(self.layers)

    # -- JSON ------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        return {"version": TABLE_VERSION, "candidates": list(self.candidates),
                "tokens": self.tokens, "loss": _finite_or_none(self.loss), "step": self.step,
                "normalization": self.normalization.value, "terms": self.terms.value,
                "meta": self.meta,
                "layers": {n: e.to_dict() for n, e in self.layers.items()}}

    def to_json(self, path: str | Path | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=1)
        if path is not None:  # atomically: a full disk never leaves a 0-byte table
            try:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise atomic.write_error(e, Path(path)) from None
            atomic.write_text(path, text + "\n")
        return text

    @classmethod
    def from_dict(cls, d: Mapping) -> SensitivityTable:
        if d.get("version") != TABLE_VERSION:
            raise UserError(f"unsupported sensitivity table version {d.get('version')!r}; "
                            f"this snip reads version {TABLE_VERSION}")
        loss = d.get("loss")
        try:
            layers = d["layers"]
            if not isinstance(layers, Mapping):
                raise TypeError("'layers' is not an object")
            return cls(candidates=tuple(d["candidates"]), tokens=int(d.get("tokens", 1)),
                       loss=float("nan") if loss is None else float(loss), step=d.get("step"),
                       normalization=Normalization(d.get("normalization", "sum")),
                       terms=Terms(d.get("terms", "both")),
                       meta=dict(d.get("meta", {})),
                       layers={n: LayerEntry.from_dict(n, e) for n, e in layers.items()})
        except UserError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            what = f"no {e}" if isinstance(e, KeyError) else f"{type(e).__name__}: {e}"
            raise UserError(f"not a sensitivity table ({what}): a table is what snip plan "
                            "--save-table (SensitivityTable.to_json) writes") from None

    @classmethod
    def from_json(cls, source: str | Path) -> SensitivityTable:
        return cls.from_dict(jsonfile.read_object(source, "sensitivity table"))


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


RawTable = Mapping[str, Mapping[str, Mapping[str, Raw]]]  # layer -> gemm -> candidate


def _scales(raw: RawTable, mode: Normalization, loss: float,
            weight_sq: float) -> tuple[float, float]:
    def total(f) -> float:
        return sum(max(f(v) for v in g.values()) for lay in raw.values() for g in lay.values())

    if mode is Normalization.SUM:
        zl = total(lambda v: max(v.loss_div, 0.0))
        zw = total(lambda v: max(v.weight_div, 0.0))
    elif mode is Normalization.NATS:
        zl = zw = total(lambda v: max(v.loss_div, 0.0) + max(v.weight_div_nats, 0.0))
    else:
        zl, zw = abs(loss), weight_sq
    return (zl if zl > 0 else 1.0), (zw if zw > 0 else 1.0)


def normalize(raw: RawTable, mode: Normalization = Normalization.SUM, *, loss: float = 1.0,
              weight_sq: float = 1.0,
              terms: Terms = Terms.BOTH) -> dict[str, dict[str, dict[str, Metric]]]:
    """Raw ``{layer: {gemm: {cand: Raw}}}`` -> :class:`Metric` with normalised forms."""
    mode, terms = Normalization(mode), Terms(terms)
    zl, zw = _scales(raw, mode, loss, weight_sq)
    keep_l, keep_w = terms is not Terms.WEIGHT, terms is not Terms.LOSS

    def metric(v: Raw) -> Metric:
        w = v.weight_div_nats if mode is Normalization.NATS else v.weight_div
        return Metric(loss_div=v.loss_div, weight_div=v.weight_div,
                      weight_div_nats=v.weight_div_nats,
                      loss_div_norm=max(v.loss_div, 0.0) / zl if keep_l else 0.0,
                      weight_div_norm=max(w, 0.0) / zw if keep_w else 0.0)

    return {n: {g: {c: metric(v) for c, v in cs.items()} for g, cs in lay.items()}
            for n, lay in raw.items()}


def _mix(a: float, b: float, decay: float) -> float:
    return decay * a + (1.0 - decay) * b


def blend(old: SensitivityTable | None, new: SensitivityTable,
          decay: float) -> SensitivityTable:
    """Exponential moving average of raw divergences: ``decay * old + (1 - decay) * new``.

    Layers or candidates missing from ``old`` take ``new``'s values.  Normalisation is redone on
    the blended raw values, with ``new``'s mode and terms.  ``decay = 0`` returns ``new``."""
    if not 0 <= decay < 1:
        raise UserError(f"EMA decay must be in [0, 1), got {decay!r}")
    if old is None or decay == 0:
        return new

    def prev(n: str, g: str, c: str, now: Raw) -> Raw:
        try:
            return old.layers[n].metrics[g][c].raw
        except KeyError:
            return now

    raw = {}
    for n, e in new.layers.items():
        raw[n] = {}
        for g, cs in e.metrics.items():
            raw[n][g] = {}
            for c, m in cs.items():
                a, b = prev(n, g, c, m.raw), m.raw
                raw[n][g][c] = Raw(*(_mix(x, y, decay) for x, y in
                                     zip(vars(a).values(), vars(b).values(), strict=True)))
    loss = _mix(old.loss, new.loss, decay) if math.isfinite(old.loss) else new.loss
    metrics = normalize(raw, new.normalization, loss=loss, terms=new.terms,
                        weight_sq=float(new.meta.get("weight_sq", 1.0)))
    layers = {}
    for n, e in new.layers.items():
        o = old.layers.get(n)
        rel = {c: {op: _mix(o.rel_err[c][op], v, decay)
                   if o is not None and op in o.rel_err.get(c, {}) else v
                   for op, v in ops.items()} for c, ops in e.rel_err.items()}
        layers[n] = LayerEntry(in_features=e.in_features, out_features=e.out_features,
                               flops=dict(e.flops), metrics=metrics[n], rel_err=rel,
                               stats=dict(e.stats))
    cycles = int(old.meta.get("ema", {}).get("cycles", 1)) + 1
    return SensitivityTable(candidates=new.candidates, layers=layers, tokens=new.tokens,
                            loss=loss, step=new.step, normalization=new.normalization,
                            terms=new.terms,
                            meta={**new.meta, "ema": {"decay": decay, "cycles": cycles}})


def synthetic_table(n_layers: int, candidates: tuple[str, ...], *, seed: int = 0,
                    shapes: Mapping[str, tuple[int, int]] | None = None,
                    tokens: int = 4096) -> SensitivityTable:
    """A random but plausible table (for tests and planner benchmarks): coarser formats get
    larger divergences, sizes vary per layer type."""
    import numpy as np

    from snip.formats import get_spec

    rng = np.random.default_rng(seed)
    shapes = shapes or {"wq": (512, 512), "wk": (512, 128), "wv": (512, 128), "wo": (512, 512),
                        "w1": (512, 1536), "w2": (1536, 512), "w3": (512, 1536)}
    raw, info = {}, {}
    for i in range(n_layers):
        for t, (k, m) in shapes.items():
            name = f"layers.{i}.{t}"
            info[name] = (k, m)
            raw[name] = {}
            for g in GEMMS:
                base = rng.lognormal(0.0, 1.0)
                raw[name][g] = {}
                for c in candidates:
                    scale = 4.0 ** (8 - min(get_spec(c).bits, 16) / 2)  # 4 bits >> 8 bits
                    dl = base * scale * rng.uniform(0.5, 1.5) if g == "fprop" else 0.0
                    dw = 0.0 if g == "fprop" else base * scale * rng.uniform(0.5, 1.5)
                    raw[name][g][c] = Raw(dl, dw, 1e-3 * dw)
    metrics = normalize(raw)
    layers = {n: LayerEntry(in_features=k, out_features=m,
                            flops=dict.fromkeys(GEMMS, 2.0 * tokens * k * m), metrics=metrics[n],
                            rel_err={c: {"x": 0.1 * rng.uniform(0.5, 2) * (8 / get_spec(c).bits),
                                         "w": 0.1 * rng.uniform(0.5, 2) * (8 / get_spec(c).bits),
                                         "dy": 0.1 * rng.uniform(0.5, 2) * (8 / get_spec(c).bits)}
                                     for c in candidates})
              for n, (k, m) in info.items()}
    return SensitivityTable(candidates=candidates, layers=layers, tokens=tokens)
