"""Weight write-back under FSDP: the policies act on whole tensors, the optimizer on shards.

FSDP2 shards every parameter along dim 0: rank ``r`` holds rows ``[r*c, min((r+1)*c, n))`` with
``c = ceil(n / world)`` (`shard_rows`), and the wrapped AdamW updates only those rows. The
write-back policies, storage grids (1x32 or 128x128 blocks), tile masks and the stochastic-
rounding generator are defined on the *global* tensor. Splitting them along shard boundaries
would need every block and tile aligned with every rank's rows and the random stream indexed
by global position; instead `ShardedWriteback` keeps a whole "shadow" copy of each managed
weight on every rank:

1. before the inner step, each rank copies its rows of the shadow (the stored weight, or the
   fp32 master a policy swapped in) into its shard;
2. the sharded AdamW steps; the updated shards are all-gathered back into the shadows;
3. `snip.optim.WritebackOptimizer` applies the policy to the shadows exactly as in one process
   (same seed, same generator draws on every rank, masks on global tiles);
4. each rank copies its rows of the new stored weights into its shard.

So FSDP with write-back equals one process (to float tolerance: AdamW is elementwise) and no
block or tile is ever split. The cost is one whole copy of the managed weights per rank (plus
masters, as in one process) and an all-gather per step: write-back state is *not* sharded.
The ``eco`` policy (it reads AdamW's moments of the whole weight) and low-precision optimizer
states (``state_format``) are refused here.

Position: ``train.loop`` (FSDP runs) -> `build_sharded` -> `WritebackOptimizer` over shadows,
with `_WholeView` standing in for the optimizer.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from snip.errors import UserError
from snip.optim.config import WritebackConfig, eligible_parameters
from snip.optim.mask import TileMask
from snip.optim.policies import Policy, as_policy
from snip.optim.writeback import StepRecord, WritebackOptimizer


def shard_rows(name: str, param: torch.Tensor, rank: int, world: int) -> slice:
    """The rows of ``param``'s global tensor that ``rank`` holds (FSDP2's dim-0 chunks); a
    `UserError` naming the tensor if its local shard does not have that many rows."""
    n = param.shape[0]
    chunk = -(-n // world)
    start, end = min(rank * chunk, n), min((rank + 1) * chunk, n)
    local = _local(param)
    if local.shape[0] != end - start or tuple(local.shape[1:]) != tuple(param.shape[1:]):
        raise UserError(f"write-back cannot place {name} (global {tuple(param.shape)}): rank "
                        f"{rank} of {world} holds a shard of {tuple(local.shape)}, not rows "
                        f"{start}:{end}; only FSDP's dim-0 sharding is supported")
    return slice(start, end)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _whole(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


class _WholeView:
    """What `WritebackOptimizer` sees as its optimizer: the real (sharded) optimizer's groups
    with the shadows in place of the managed parameters; `step` runs the real one on shards."""

    def __init__(self, optimizer: torch.optim.Optimizer, owner: ShardedWriteback) -> None:
        self.optimizer, self.owner = optimizer, owner
        self.state: dict = {}  # no whole-tensor optimizer state (see the module doc)

    @property
    def param_groups(self) -> list[dict]:
        swap = self.owner.shadow_of
        return [{**g, "params": [swap.get(id(p), p) for p in g["params"]]}
                for g in self.optimizer.param_groups]

    def step(self, closure: Callable | None = None) -> Any:
        self.owner.scatter()
        loss = self.optimizer.step(closure)
        self.owner.gather()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {}  # the sharded optimizer is checkpointed on its own (DCP)

    def load_state_dict(self, state: dict) -> None:
        pass


class ShardedWriteback:
    """`WritebackOptimizer`'s interface (``step``, ``history``, ``record_every``, state dicts)
    for an FSDP model: see the module doc. Build it with `build_sharded`."""

    def __init__(self, optimizer: torch.optim.Optimizer,
                 named: list[tuple[str, torch.Tensor]], config: WritebackConfig,
                 rank: int, world: int, mask: TileMask | None = None) -> None:
        self.optimizer = optimizer
        self.params = [(n, p, shard_rows(n, p, rank, world)) for n, p in named]
        self.shadows = {n: _whole(p.detach()).clone() for n, p, _ in self.params}
        self.shadow_of = {id(p): self.shadows[n] for n, p, _ in self.params}
        self.wb = WritebackOptimizer(
            _WholeView(optimizer, self), list(self.shadows.items()), element=config.format,
            policy=config.policy, mask=mask, seed=config.seed, tile_size=config.tile_size,
            record_every=config.record_every, record_tiles=config.record_tiles)
        self.scatter()  # the initial RNE rounding onto the grid

    @property
    def record_every(self) -> int:
        return self.wb.record_every

    @record_every.setter
    def record_every(self, value: int) -> None:
        self.wb.record_every = value

    @property
    def history(self) -> list[StepRecord]:
        return self.wb.history

    @torch.no_grad()
    def scatter(self) -> None:
        """Each rank's rows of the shadows into its shards."""
        for n, p, rows in self.params:
            _local(p.detach()).copy_(self.shadows[n][rows])

    @torch.no_grad()
    def gather(self) -> None:
        """The shards into the shadows (an all-gather per tensor)."""
        for n, p, _ in self.params:
            self.shadows[n].copy_(_whole(p.detach()))

    def step(self, closure: Callable | None = None) -> Any:
        if self.wb.record_every:  # the audit's gradient norms need whole gradients
            for n, p, _ in self.params:
                self.shadows[n].grad = None if p.grad is None else _whole(p.grad)
        loss = self.wb.step(closure)
        self.scatter()
        for shadow in self.shadows.values():
            shadow.grad = None
        return loss

    def never_moved(self) -> dict[str, float]:
        return self.wb.never_moved()

    def state_dict(self) -> dict:
        return self.wb.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Masters, generator and counters (identical on every rank); the weights come from the
        model's own checkpoint, so the shadows are re-gathered from it."""
        self.gather()
        self.wb.load_state_dict(state)


def build_sharded(model: nn.Module, optimizer: torch.optim.Optimizer, config: WritebackConfig,
                  rank: int, world: int) -> ShardedWriteback:
    """`ShardedWriteback` for an FSDP-sharded ``model`` and its optimizer, as ``config`` says
    (the same eligible parameters, mask and seed as `snip.optim.build` in one process)."""
    policy = as_policy(config.policy)
    if policy is Policy.ECO:
        raise UserError("writeback.policy=eco is not supported with dist.strategy=fsdp (it "
                        "reads AdamW's moments of the whole weight); use dist.strategy ddp")
    if config.state_format:
        raise UserError("writeback.state_format is not supported with dist.strategy=fsdp; use "
                        "dist.strategy ddp")
    named = eligible_parameters(model, config.include, config.exclude)
    mask = TileMask.load(Path(config.mask)) if config.mask else None
    if mask is not None and mask.tile_size != config.tile_size:
        raise UserError(f"mask {config.mask!r} uses tile_size {mask.tile_size}, config says "
                        f"{config.tile_size}; set tile_size to {mask.tile_size}")
    return ShardedWriteback(optimizer, named, config, rank, world, mask)
