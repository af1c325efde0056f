"""``WritebackOptimizer``: any torch optimizer, with chosen weights stored on a low-precision grid.

The wrapped optimizer computes in fp32 as usual.  Around its ``step`` this wrapper

1. remembers each managed weight's stored value ``q`` (values on the grid, fp32 carrier);
2. lets the policy swap fp32 masters in (``master`` / ``selective_master``);
3. runs the optimizer, which produces ``x = q + d`` (``d``: the proposal);
4. writes back ``q' = Q(x)`` through the policy (RNE, stochastic, master, ECO ...);
5. records what the audit needs: the exact invisible-update event ``q' == q`` per coordinate,
   its fraction per tensor and per tile, the never-moved fraction since initialisation, and the
   norms ``||d||``, ``||g||``, ``||w||`` used by the scale-free ratio rho.

Stored weights are kept in fp32 tensors whose values lie exactly on the grid ("fake" storage:
the model runs unchanged); :mod:`benchmarks.bench_writeback` accounts the bytes a real packed
store would need.  At construction every managed weight is written onto the grid once with RNE
(the same initial stored weights for every policy); masters start from the fp32 values.

LR schedulers must be built on the *inner* optimizer (``wb.optimizer``): torch checks the type.
A ``closure`` passed to :meth:`step` runs with masters swapped in.

Position in the data flow: ``train.loop`` -> ``WritebackOptimizer.step`` -> wrapped optimizer ->
``policy.write`` -> ``StorageGrid.round``; ``snip.audit`` reads :attr:`history`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from snip.errors import UserError
from snip.formats import ElementFormat, QuantSpec, Rounding
from snip.formats.spec import PRESETS
from snip.optim.grid import StorageGrid
from snip.optim.mask import DEFAULT_TILE_SIZE, TileMask, tile_means
from snip.optim.policies import Policy, Slot, StepContext, WritebackPolicy, make_policy

STATE_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class StateFormat:
    """Low-precision optimizer states: the :class:`StorageGrid` named ``name``, with its
    precedence rule (``bf16``: cast; a preset such as ``mxfp8_e4m3`` or ``int8``: block-scaled).
    """

    name: str
    grid: StorageGrid = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            grid = StorageGrid.parse(self.name)
        except ValueError:
            raise UserError(f"unknown optimizer state format {self.name!r}: use an element "
                            f"(bf16, fp16) or a preset ({', '.join(PRESETS)})") from None
        object.__setattr__(self, "grid", grid)

    @property
    def bits_per_element(self) -> float:
        return self.grid.bits_per_element

    def round(self, x: torch.Tensor) -> torch.Tensor:
        return self.grid.round(x, Rounding.RNE)


def _named(params: Iterable) -> list[tuple[str, torch.Tensor]]:
    out = []
    for i, item in enumerate(params):
        name, p = item if isinstance(item, tuple) else (f"param{i}", item)
        if not isinstance(p, torch.Tensor) or not p.is_floating_point():
            raise UserError(f"parameter {name!r} must be a floating-point tensor")
        if p.dtype != torch.float32:
            raise UserError(f"parameter {name!r} has dtype {p.dtype}; write-back needs fp32 "
                            f"carriers (the grid is simulated in fp32)")
        out.append((str(name), p))
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise UserError("managed parameter names must be unique")
    return out


@dataclass(frozen=True)
class TensorRecord:
    """The write-back audit of one managed tensor at one step.

    ``frozen``: share of its coordinates whose stored value did not change (the exact
    invisible-update event ``Q(q + d) == q``); ``never_moved``: share that never changed since
    wrapping; the norms of the update ``d``, the new stored weights and the gradient;
    ``tile_frozen``: per-tile frozen fractions (with ``record_tiles``)."""

    numel: int
    frozen: float
    never_moved: float
    d_norm: float
    w_norm: float
    g_norm: float
    tile_frozen: torch.Tensor | None = None


@dataclass(frozen=True)
class StepRecord:
    """One recorded optimizer step: its number (steps completed), learning rate and tensors."""

    step: int
    lr: float
    tensors: dict[str, TensorRecord]


class WritebackOptimizer:
    """Wrap ``optimizer`` so that ``params`` are stored on ``element``'s grid; see module doc.

    ``params``: ``(name, tensor)`` pairs (names are what masks refer to) or bare tensors.
    ``element``: an element name (analytic grid, scale 1), a preset/``QuantSpec`` (scaled grid)
    or a :class:`StorageGrid`.  ``policy``: a :class:`Policy` name or a ``WritebackPolicy``.
    ``seed`` seeds the stochastic-rounding generator.  ``record_every=0`` turns recording off;
    ``record_tiles`` adds the per-tile frozen fractions to each record (one float per tile per
    recorded step: keep ``record_every`` large on big models).  ``eco_rounding``: the rounding
    inside the ``eco`` policy (stochastic, as the ECO paper's headline setting, or rne).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, params: Iterable, *,
                 element: str | ElementFormat | QuantSpec | StorageGrid = "e4m3",
                 policy: Policy | str | WritebackPolicy = Policy.RNE, mask: TileMask | None = None,
                 seed: int = 0, state_format: str | None = None,
                 tile_size: int = DEFAULT_TILE_SIZE, record_every: int = 1,
                 record_tiles: bool = False,
                 eco_rounding: Rounding | str = Rounding.STOCHASTIC) -> None:
        self.optimizer = optimizer
        self.grid = StorageGrid.parse(element)
        self.policy = make_policy(policy, mask, eco_rounding)
        named = _named(params)
        if mask is not None:
            mask.check({n: p.shape for n, p in named}, source="the write-back mask")
        self._groups = self._group_map(named)
        self.tile_size = tile_size
        self.record_every, self.record_tiles = record_every, record_tiles
        self.state_format = StateFormat(name=state_format) if state_format else None
        device = named[0][1].device if named else torch.device("cpu")
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self.slots = [Slot(name=n, param=p) for n, p in named]
        self.moved = {n: torch.zeros(p.shape, dtype=torch.bool, device=p.device) for n, p in named}
        self.step_count = 0
        self.history: list[StepRecord] = []
        with torch.no_grad():
            for s in self.slots:
                self.policy.setup(s, self.grid)
                s.param.copy_(self.grid.round(s.param.detach(), Rounding.RNE))

    def _group_map(self, named: list[tuple[str, torch.Tensor]]) -> dict[int, dict]:
        groups = {id(p): g for g in self.optimizer.param_groups for p in g["params"]}
        for n, p in named:
            if id(p) not in groups:
                raise UserError(f"parameter {n!r} is not in the wrapped optimizer's param_groups; "
                                f"build the optimizer over the model's parameters first")
        return groups

    # ---- passthrough ---------------------------------------------------------------------
    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    # ---- the step ------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):
        stored = {s.name: s.param.detach().clone() for s in self.slots}
        for s in self.slots:
            self.policy.before_step(s)
        start = {s.name: s.param.detach().clone() for s in self.slots} if any(
            "master" in s.state for s in self.slots) else stored
        grads = {s.name: s.param.grad for s in self.slots}
        loss = self.optimizer.step(closure)
        self.step_count += 1
        rec = self.step_count % self.record_every == 0 if self.record_every else False
        tensors = {}
        for s in self.slots:
            group = self._groups[id(s.param)]
            ctx = StepContext(grid=self.grid, generator=self.generator, optimizer=self.optimizer,
                              group=group)
            x = s.param.detach()
            new = self.policy.write(s, x, ctx)
            frozen = new == stored[s.name]
            self.moved[s.name] |= ~frozen
            if rec:
                d = x - start[s.name]
                tensors[s.name] = self._record(s.name, frozen, d, grads[s.name], new)
            s.param.copy_(new)
        if self.state_format is not None:
            self._round_states()
        if rec:
            lr = float(self.optimizer.param_groups[0]["lr"])
            self.history.append(StepRecord(step=self.step_count, lr=lr, tensors=tensors))
        return loss

    def _record(self, name: str, frozen: torch.Tensor, d: torch.Tensor, g: torch.Tensor | None,
                w: torch.Tensor) -> TensorRecord:
        tiles = tile_means(frozen.float(), self.tile_size).float() if self.record_tiles else None
        n = frozen.numel()  # integer counts: never_moved <= frozen holds exactly
        return TensorRecord(numel=n, frozen=int(frozen.sum()) / n,
                            never_moved=(n - int(self.moved[name].sum())) / n,
                            d_norm=float(d.norm()), w_norm=float(w.norm()),
                            g_norm=float(g.norm()) if g is not None else 0.0, tile_frozen=tiles)

    def _round_states(self) -> None:
        for s in self.slots:
            for v in self.optimizer.state.get(s.param, {}).values():
                if torch.is_tensor(v) and v.is_floating_point() and v.shape == s.param.shape:
                    v.copy_(self.state_format.round(v))

    # ---- audit helpers -------------------------------------------------------------------
    def never_moved(self) -> dict[str, float]:
        """Fraction of each managed tensor whose stored value never changed since wrapping."""
        return {n: (m.numel() - int(m.sum())) / m.numel() for n, m in self.moved.items()}

    def state_bytes(self) -> dict[str, int]:
        """Bytes of write-back state: packed stored weights, masters/indices, optimizer states."""
        stored = sum(int(s.param.numel() * self.grid.bits_per_element + 7) // 8 for s in self.slots)
        extra = sum(self.policy.extra_bytes(s) for s in self.slots)
        opt = 0
        for s in self.slots:
            for v in self.optimizer.state.get(s.param, {}).values():
                if isinstance(v, torch.Tensor) and v.shape == s.param.shape:
                    bits = 32 if self.state_format is None else self.state_format.bits_per_element
                    opt += int(v.numel() * bits + 7) // 8
        return {"stored_weights": stored, "policy_state": extra, "optimizer_state": opt}

    # ---- checkpoints ---------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Inner optimizer state plus masters, ECO/generator state and the audit counters.

        Stored weights are model parameters: save the model's ``state_dict`` beside this.
        """
        return {"optimizer": self.optimizer.state_dict(),
                "writeback": {"version": STATE_VERSION, "policy": self.policy.policy.value,
                              "grid": self.grid.name, "step": self.step_count,
                              "generator": self.generator.get_state(),
                              "slots": {s.name: {k: v.clone() for k, v in s.state.items()}
                                        for s in self.slots},
                              "moved": {n: m.clone() for n, m in self.moved.items()}}}

    def load_state_dict(self, state: dict) -> None:
        wb = state["writeback"]
        if wb.get("version") != STATE_VERSION:
            raise UserError(f"write-back state version {wb.get('version')!r} is not "
                            f"{STATE_VERSION}; it was written by another snip version")
        if wb["policy"] != self.policy.policy.value or wb["grid"] != self.grid.name:
            raise UserError(f"checkpoint was written with policy {wb['policy']!r} on grid "
                            f"{wb['grid']!r}, but this optimizer uses {self.policy.policy.value!r}"
                            f" on {self.grid.name!r}; rebuild it with the checkpoint's settings")
        names = {s.name for s in self.slots}
        if set(wb["slots"]) != names:
            raise UserError(f"checkpoint manages parameters {sorted(wb['slots'])[:5]}..., this "
                            f"optimizer {sorted(names)[:5]}...; the models differ")
        self.optimizer.load_state_dict(state["optimizer"])
        self.step_count = int(wb["step"])
        self.generator.set_state(wb["generator"])
        for s in self.slots:
            for k, v in wb["slots"][s.name].items():
                s.state[k] = v.clone().to(s.param.device)
            self.moved[s.name] = wb["moved"][s.name].clone().to(s.param.device)

