"""How a run's training state lies across ranks: one object builds, loads, saves and gathers it.

The training state is the model, the module the training forwards call (``engine``), the AdamW
optimizer and the weight write-back wrapper. Where those live depends on the strategy, and so do
four things the trainer does with them:

    Layout = runstate.layout(dist, strategy)     the class for this run (before anything is built)
    Layout.check(cfg)                            refuse what this layout cannot do
    Layout.check_fits(cfg, model_cfg, device, dist)  ... or fit in memory
    state = Layout.build(cfg, model, dist, ckpt, fresh_wrapper=...)
                                                 wrap, build the optimizer and write-back, and
                                                 load a checkpoint's weights and optimizer state
    state.save(root, step, contents, keep)       one checkpoint (a collective where sharded)
    state.full_replica(bare)                     whole weights and Adam moments (the statistics)

Two implementations:

* `Replicated`: one process, or DDP. Every rank holds the whole model; rank 0 writes a
  single-file checkpoint while the others wait.
* `Sharded`: FSDP2. Every rank holds shards (DTensors), so the optimizer is built after
  sharding; a single-file checkpoint is loaded whole before sharding and its optimizer state
  by parameter name; every rank writes its shards of a checkpoint (DCP); the controller's
  statistics run on a gathered replica.

Either reads either kind of checkpoint: DCP reshards a sharded one to any layout. The trainer
never asks which layout it has.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from snip.errors import UserError
from snip.models import ModelConfig
from snip.train import checkpoint, distributed, memory
from snip.train import config as C
from snip.train import writeback as wb


def make_optimizer(model: nn.Module, t: C.TrainSection) -> torch.optim.AdamW:
    """AdamW with weight decay on weight matrices only: norm gains, biases and embeddings
    are not decayed (shrinking them towards zero has no regularizing meaning)."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 and id(p) not in embeddings else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": t.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=t.lr, betas=(t.beta1, t.beta2))


@dataclass(frozen=True)
class Contents:
    """What a checkpoint holds beside the training state (the trainer's part of it)."""

    plan: dict[str, Any]
    config_toml: str  # the run's config.toml (rank 0's; other ranks pass "")
    meta: checkpoint.Meta
    tokenizer: dict[str, Any] | None  # the data tokenizer's to_dict() (None: token data)
    controller: dict[str, Any] | None


@dataclass
class RunState:
    """The model, the module its training forwards run through, the optimizer and the
    write-back wrapper of one run, as they lie across its ranks (the module docstring)."""

    model: nn.Module
    engine: nn.Module
    optimizer: torch.optim.AdamW
    writeback: wb.Writeback | None
    dist: distributed.DistInfo
    shards_weights: ClassVar[bool] = False  # for the memory estimate

    @classmethod
    def check(cls, cfg: C.Config) -> None:
        """Refuse settings this layout cannot run (before the processes join: every rank
        fails alike, at once)."""

    @classmethod
    def check_fits(cls, cfg: C.Config, model_cfg: ModelConfig, device: torch.device,
                   dist: distributed.DistInfo) -> None:
        """Refuse, before the model is built, a run whose memory estimate does not fit."""
        t = cfg.train
        memory.check(model_cfg, t.batch_size // t.grad_accum // dist.world_size, t.seq_len,
                     device, world_size=dist.world_size, sharded=cls.shards_weights,
                     force=t.force)

    @classmethod
    def build(cls, cfg: C.Config, model: nn.Module, dist: distributed.DistInfo,
              ckpt: checkpoint.Checkpoint | None, *, fresh_wrapper: bool) -> RunState:
        """The state around ``model`` (converted, with the run's initial weights), with
        ``ckpt``'s weights, optimizer and write-back state loaded; ``fresh_wrapper``: a branch
        with other write-back settings, whose wrapper starts anew."""
        raise NotImplementedError

    def save(self, root: Path, step: int, contents: Callable[[], Contents],
             keep: int | None) -> Path | None:
        """Checkpoint ``step`` under ``root`` (every rank calls it; every rank returns when it
        is on disk); its directory on rank 0, None on the others. ``contents`` is called only
        where it is needed."""
        raise NotImplementedError

    def full_replica(self, bare: Callable[[], tuple[nn.Module, torch.optim.Optimizer]],
                     ) -> tuple[nn.Module, torch.optim.Optimizer]:
        """The model and optimizer with whole tensors on every rank (a collective where
        sharded); ``bare()`` builds an empty copy to gather into."""
        return self.model, self.optimizer

    def _writeback_state(self) -> dict[str, Any] | None:
        return self.writeback.state_dict() if self.writeback is not None else None

    def release_engine(self) -> None:
        """Drop the wrapper (DDP's reducer must go before the process group, see
        `distributed.teardown`)."""
        self.engine = self.model


def _wrap(cfg: C.Config, model: nn.Module, dist: distributed.DistInfo) -> nn.Module:
    """`distributed.wrap` with the run's strategy and FSDP settings."""
    return distributed.wrap(
        model, dist, cfg.dist.strategy, mixed_precision=cfg.dist.mixed_precision,
        cpu_offload=cfg.dist.cpu_offload)


def _restore_wrapper(writeback: wb.Writeback | None, optimizer: torch.optim.Optimizer,
                     ckpt: checkpoint.Checkpoint, fresh_wrapper: bool) -> None:
    """The write-back wrapper's own state, after the inner optimizer's was loaded."""
    if writeback is not None or ckpt.writeback is not None:
        wb.restore(writeback, optimizer, optimizer.state_dict(), ckpt.writeback, ckpt.path,
                   fresh_wrapper=fresh_wrapper)


class Replicated(RunState):
    """One process or DDP: whole tensors on every rank; rank 0 writes the checkpoint."""

    @classmethod
    def build(cls, cfg: C.Config, model: nn.Module, dist: distributed.DistInfo,
              ckpt: checkpoint.Checkpoint | None, *, fresh_wrapper: bool) -> Replicated:
        engine = _wrap(cfg, model, dist)
        optimizer = make_optimizer(model, cfg.train)
        writeback = wb.attach(cfg.writeback, model, optimizer, cfg.seed)
        if ckpt is not None and ckpt.sharded:  # DCP reshards to whole tensors
            checkpoint.load_state(ckpt.path, model, optimizer)
            _restore_wrapper(writeback, optimizer, ckpt, fresh_wrapper)
        elif ckpt is not None:  # optimizer (+ write-back) first: a mismatch fails first
            wb.restore(writeback, optimizer, ckpt.optimizer, ckpt.writeback, ckpt.path,
                       fresh_wrapper=fresh_wrapper)
            ckpt.load_weights(model)
        return cls(model=model, engine=engine, optimizer=optimizer, writeback=writeback,
                   dist=dist)

    def save(self, root: Path, step: int, contents: Callable[[], Contents],
             keep: int | None) -> Path | None:
        path = None
        if self.dist.is_main:
            c = contents()
            path = checkpoint.save(
                root, step, model=self.model, optimizer=self.optimizer, plan=c.plan,
                config_toml=c.config_toml, meta=c.meta, tokenizer=c.tokenizer,
                controller=c.controller, keep=keep,
                writeback=self._writeback_state())
        distributed.barrier(self.dist, "waiting for rank 0 to save a checkpoint")
        return path


class Sharded(RunState):
    """FSDP2: every rank holds shards of the weights, the moments and the write-back state."""

    shards_weights = True

    @classmethod
    def check(cls, cfg: C.Config) -> None:
        if cfg.writeback.policy is C.WritebackPolicy.ECO or cfg.writeback.state_format:
            what = ("writeback.policy=eco" if cfg.writeback.policy is C.WritebackPolicy.ECO
                    else "writeback.state_format")
            raise UserError(f"{what} is not supported with dist.strategy=fsdp (it needs AdamW's "
                            "state of the whole weight); use dist.strategy ddp")

    @classmethod
    def build(cls, cfg: C.Config, model: nn.Module, dist: distributed.DistInfo,
              ckpt: checkpoint.Checkpoint | None, *, fresh_wrapper: bool) -> Sharded:
        whole_optim = None
        if ckpt is not None and not ckpt.sharded:
            # a single-file checkpoint: whole weights before sharding, the optimizer state
            # keyed by name (loaded into the shards below)
            ckpt.load_weights(model)
            whole_optim = checkpoint.full_optimizer_state(
                model, ckpt.optimizer, lambda m: make_optimizer(m, cfg.train))
        engine = _wrap(cfg, model, dist)  # shards in place: the optimizer comes after
        optimizer = make_optimizer(model, cfg.train)
        writeback = None
        if cfg.writeback.policy is not C.WritebackPolicy.NONE:  # whole tensors
            from snip.optim.shard import build_sharded

            config = cfg.writeback.to_config(seed=cfg.seed, record_every=0)
            writeback = wb.Writeback(wb=build_sharded(model, optimizer, config, dist.rank,
                                                      dist.world_size),
                                     policy=cfg.writeback.policy.value)
        if ckpt is not None:
            if whole_optim is None:  # weights too: DCP reshards to this run's layout
                checkpoint.load_state(ckpt.path, model, optimizer)
            else:
                checkpoint.load_full_optimizer(model, optimizer, whole_optim)
            _restore_wrapper(writeback, optimizer, ckpt, fresh_wrapper)
        return cls(model=model, engine=engine, optimizer=optimizer, writeback=writeback,
                   dist=dist)

    def save(self, root: Path, step: int, contents: Callable[[], Contents],
             keep: int | None) -> Path | None:
        c = contents()
        with distributed.collective(self.dist, "saving a sharded checkpoint"):
            path = checkpoint.save_sharded(
                root, step, rank=self.dist.rank, model=self.model, optimizer=self.optimizer,
                plan=c.plan, config_toml=c.config_toml, meta=c.meta, tokenizer=c.tokenizer,
                controller=c.controller, keep=keep,
                writeback=self._writeback_state())
        distributed.barrier(self.dist, "waiting for the sharded checkpoint")
        return path if self.dist.is_main else None

    def full_replica(self, bare: Callable[[], tuple[nn.Module, torch.optim.Optimizer]],
                     ) -> tuple[nn.Module, torch.optim.Optimizer]:
        with distributed.collective(self.dist, "gathering the weights for the statistics"):
            return distributed.full_replica(self.model, self.optimizer, bare)


def layout(dist: distributed.DistInfo, strategy: distributed.Strategy) -> type[RunState]:
    """The layout of a run: sharded only for FSDP across more than one process."""
    return Sharded if dist.enabled and strategy is distributed.Strategy.FSDP else Replicated
