"""Data parallelism with torch.distributed, the small subset the trainer needs.

Launched by ``torchrun --nproc_per_node N $(which snip) train ...``, every process reads its
``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` from the environment; a plain ``python`` launch is a
world of one and never touches ``torch.distributed``. Backend: NCCL on GPUs, gloo on CPUs.

We average gradients by hand (one flattened ``all_reduce`` after the last micro-step) instead of
wrapping the model in ``DistributedDataParallel``: the precision planner swaps and re-configures
``QLinear`` modules during training, which DDP's bucket bookkeeping does not expect, and the
explicit reduction makes "N ranks == one rank with the same global batch" easy to see. Rank 0
alone writes logs, plans, checkpoints and the report.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def setup(device_type: str) -> DistInfo:
    """Join the process group described by torchrun's environment variables (if any)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DistInfo()
    info = DistInfo(rank=int(os.environ["RANK"]), local_rank=int(os.environ.get("LOCAL_RANK", 0)),
                    world_size=world_size)
    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        dist.init_process_group(backend=backend)
    return info


def teardown(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()


def broadcast_parameters(model: nn.Module, info: DistInfo) -> None:
    """Make every rank start from rank 0's weights (seeded init already agrees; this is cheap
    insurance against an init that reads a per-rank random stream)."""
    if info.enabled:
        for t in model.state_dict().values():
            dist.broadcast(t, src=0)


def average_gradients(model: nn.Module, info: DistInfo) -> None:
    """Replace each gradient by its mean over ranks, in one flattened all-reduce."""
    if not info.enabled:
        return
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= info.world_size
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def mean_over_ranks(value: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.enabled:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= info.world_size
    return value


def any_rank(flag: bool, info: DistInfo) -> bool:
    """True if ``flag`` is set on any rank (so that every rank stops at the same step)."""
    if not info.enabled:
        return flag
    t = torch.tensor([1.0 if flag else 0.0])
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())
