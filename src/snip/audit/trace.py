"""Reference traces: what an fp32 run must remember to audit and protect a low-precision run.

An fp32 *reference* run uses the same initialisation and data order as the low-precision target
runs.  At each recorded step (every ``every`` steps) :class:`ReferenceRecorder` sees the weights
``w`` before the step, the gradient ``g`` and the proposal ``d = w_after - w`` (the full AdamW
increment, learning rate and weight decay included), and keeps, per eligible tensor:

* norms ``||w||, ||d||, ||g||`` and the learning rate (for rho, Eq. 3);
* for each target format, the projected-reference proxy (P-a)
  ``F_proj(t) = mean_i 1[Q(Q(w_i) + d_i) == Q(w_i)]`` per tensor, optionally per tile;
* over the first ``score_steps`` steps, the running per-tile means of the allocation score
  ``|g * d|`` (proposal contribution) and of the projected frozen indicator (freeze-only score).

Nothing per coordinate is kept, so a trace is small: ``T x tensors`` scalars plus one vector per
tile.  :meth:`ReferenceTrace.save` writes one ``.npz`` (arrays under ``key/name`` paths plus a JSON
``meta``); :meth:`ReferenceTrace.load` reads it back.  Consumers: :mod:`snip.audit.allocate`
(masks) and :mod:`snip.audit.forecast` (measured vs projected frozen fraction, crossings).
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from snip.audit.events import projected_frozen
from snip.errors import MissingFileError, UserError
from snip.formats import get_element
from snip.optim.mask import DEFAULT_TILE_SIZE, num_tiles, tile_means

TRACE_VERSION = 1
_RECORD_ONE = "record one with `snip audit --out DIR` (it writes DIR/trace.npz)"


@dataclass(frozen=True, kw_only=True)
class ReferenceTrace:
    """A recorded fp32 reference trace (see module docstring); arrays are numpy."""

    names: list[str]
    shapes: dict[str, tuple[int, ...]]
    formats: list[str]
    tile_size: int = DEFAULT_TILE_SIZE
    score_steps: int = 0
    steps: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    lr: np.ndarray = field(default_factory=lambda: np.zeros(0))
    norms: dict[str, np.ndarray] = field(default_factory=dict)  # name -> [T, 3] (w, d, g)
    frozen: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # fmt -> name -> [T]
    tile_frozen: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # [T, tiles]
    score: dict[str, np.ndarray] = field(default_factory=dict)  # name -> [tiles] mean |g d|
    freeze_score: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # fmt->name
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for f in self.formats:
            get_element(f)
        missing = [n for n in self.names if n not in self.shapes]
        if missing:
            raise UserError(f"trace has no shape for {missing[:3]}")

    def projected(self, fmt: str, name: str | None = None) -> np.ndarray:
        """Projected frozen fraction over time, one tensor or numel-weighted over all."""
        if fmt not in self.frozen:
            raise UserError(f"trace has no projection for format {fmt!r}; it recorded "
                            f"{self.formats}. Re-record with --formats {fmt}")
        if name is not None:
            return self.frozen[fmt][name]
        w = np.array([np.prod(self.shapes[n]) for n in self.names], dtype=np.float64)
        stack = np.stack([self.frozen[fmt][n] for n in self.names], 1)
        return stack @ (w / w.sum())

    # ---- file round trip -----------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays = {"steps": self.steps, "lr": self.lr}
        for n in self.names:
            arrays[f"norms/{n}"] = self.norms[n]
            if n in self.score:
                arrays[f"score/{n}"] = self.score[n]
        for key, table in (("frozen", self.frozen), ("tile_frozen", self.tile_frozen),
                           ("freeze_score", self.freeze_score)):
            for f, per in table.items():
                for n, a in per.items():
                    arrays[f"{key}/{f}/{n}"] = a
        meta = {"version": TRACE_VERSION, "kind": "snip.reference_trace", "names": self.names,
                "shapes": {n: list(s) for n, s in self.shapes.items()}, "formats": self.formats,
                "tile_size": self.tile_size, "score_steps": self.score_steps, "meta": self.meta}
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        with open(path, "wb") as fh:
            np.savez_compressed(fh, **arrays)
        return path

    @classmethod
    def load(cls, path: str | Path) -> ReferenceTrace:
        path = Path(path)
        if not path.is_file():
            raise MissingFileError(f"trace file {str(path)!r} does not exist; {_RECORD_ONE}")
        try:
            with np.load(path) as z:
                data = {k: z[k] for k in z.files}
        except (EOFError, OSError, ValueError, AttributeError, zipfile.BadZipFile) as e:
            raise UserError(f"{str(path)!r} is not a snip reference trace ("
                            f"{'empty file' if isinstance(e, EOFError) else type(e).__name__}); "
                            f"{_RECORD_ONE}") from None
        if "meta" not in data:
            raise UserError(f"{str(path)!r} is not a snip reference trace (no meta)")
        meta = json.loads(bytes(data.pop("meta")).decode())
        if meta.get("kind") != "snip.reference_trace" or meta.get("version") != TRACE_VERSION:
            raise UserError(f"{str(path)!r}: unsupported trace kind/version "
                            f"{meta.get('kind')!r}/{meta.get('version')!r}")
        tables: dict[str, dict] = {"frozen": {}, "tile_frozen": {}, "freeze_score": {}}
        norms, score = {}, {}
        for key, a in data.items():
            head, _, rest = key.partition("/")
            if head == "norms":
                norms[rest] = a
            elif head == "score":
                score[rest] = a
            elif head in tables:
                f, _, n = rest.partition("/")
                tables[head].setdefault(f, {})[n] = a
        return cls(names=meta["names"], shapes={n: tuple(s) for n, s in meta["shapes"].items()},
                   formats=meta["formats"], tile_size=meta["tile_size"],
                   score_steps=meta["score_steps"], steps=data["steps"], lr=data["lr"],
                   norms=norms, score=score, meta=meta.get("meta", {}), **tables)


class ReferenceRecorder:
    """Wraps the fp32 reference optimizer's step and accumulates a :class:`ReferenceTrace`.

    ``params``: ``(name, tensor)`` pairs (the eligible weights).  ``formats``: target element
    formats for the proxy.  ``score_steps``: steps over which tile scores are averaged (0: all).
    ``tiles``: also keep the per-tile projected frozen fraction of every recorded step.
    """

    def __init__(self, params: Iterable[tuple[str, torch.Tensor]], *,
                 formats: Sequence[str] = ("e4m3", "e5m2"), tile_size: int = DEFAULT_TILE_SIZE,
                 score_steps: int = 0, every: int = 1, tiles: bool = False) -> None:
        self.params = list(params)
        self.formats = [get_element(f).name for f in formats]
        if every < 1:
            raise UserError(f"record every must be >= 1, got {every}")
        self.tile_size, self.score_steps = tile_size, score_steps
        self.every, self.tiles = every, tiles
        self.t = 0
        self._steps: list[int] = []
        self._lr: list[float] = []
        self._norms = {n: [] for n, _ in self.params}
        self._frozen = {f: {n: [] for n, _ in self.params} for f in self.formats}
        self._tile_frozen = {f: {n: [] for n, _ in self.params} for f in self.formats}
        self._score = {n: torch.zeros(num_tiles(p.numel(), tile_size), dtype=torch.float64)
                       for n, p in self.params}
        self._freeze = {f: {n: torch.zeros_like(s) for n, s in self._score.items()}
                        for f in self.formats}
        self._scored = 0

    @torch.no_grad()
    def step(self, optimizer: torch.optim.Optimizer, closure=None):
        """Run ``optimizer.step`` and record this step (if due)."""
        self.begin()
        loss = optimizer.step(closure)
        self.end(optimizer)
        return loss

    @torch.no_grad()
    def begin(self) -> None:
        """Before the optimizer update: keep the weights and gradients it starts from (the
        trainer calls this from a hook, `snip.audit.RecorderHook`)."""
        self._before = [p.detach().clone() for _, p in self.params]
        self._grads = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
                       for _, p in self.params]

    @torch.no_grad()
    def end(self, optimizer: torch.optim.Optimizer) -> None:
        """After the update: record this step (if due) against what `begin` kept."""
        before, grads = self._before, self._grads
        self._before = self._grads = []
        self.t += 1
        score_now = self.score_steps == 0 or self.t <= self.score_steps
        record_now = self.t % self.every == 0
        if not (score_now or record_now):
            return
        if record_now:
            self._steps.append(self.t)
            self._lr.append(float(optimizer.param_groups[0]["lr"]))
        for (n, p), w, g in zip(self.params, before, grads, strict=True):
            self._observe(n, w, p.detach() - w, g, score_now, record_now)
        self._scored += int(score_now)

    def _observe(self, n: str, w: torch.Tensor, d: torch.Tensor, g: torch.Tensor,
                 score_now: bool, record_now: bool) -> None:
        if record_now:
            self._norms[n].append([float(w.norm()), float(d.norm()), float(g.norm())])
        if score_now:
            self._score[n] += tile_means((g * d).abs(), self.tile_size).cpu()
        for f in self.formats:
            fz = projected_frozen(w, d, f).float()
            # the accumulators live on the CPU whatever the model's device
            tm = (tile_means(fz, self.tile_size).cpu() if score_now or (self.tiles and record_now)
                  else None)
            if record_now:
                self._frozen[f][n].append(float(fz.mean()))
                if self.tiles:
                    self._tile_frozen[f][n].append(tm.float().numpy())
            if score_now:
                self._freeze[f][n] += tm

    def trace(self, meta: dict | None = None) -> ReferenceTrace:
        k = max(self._scored, 1)
        names = [n for n, _ in self.params]
        tile_frozen = ({f: {n: np.stack(v) if v else np.zeros((0, 0), np.float32)
                            for n, v in per.items()} for f, per in self._tile_frozen.items()}
                       if self.tiles else {})
        return ReferenceTrace(
            names=names, shapes={n: tuple(p.shape) for n, p in self.params},
            formats=self.formats, tile_size=self.tile_size, score_steps=self._scored,
            steps=np.array(self._steps, np.int64), lr=np.array(self._lr),
            norms={n: np.array(v, np.float64).reshape(-1, 3) for n, v in self._norms.items()},
            frozen={f: {n: np.array(v) for n, v in per.items()} for f, per in self._frozen.items()},
            tile_frozen=tile_frozen,
            score={n: (s / k).numpy() for n, s in self._score.items()},
            freeze_score={f: {n: (s / k).numpy() for n, s in per.items()}
                          for f, per in self._freeze.items()},
            meta=dict(meta or {}))
