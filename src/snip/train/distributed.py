"""Data parallelism with torch.distributed, the small subset the trainer needs.

Launched by ``torchrun --nproc_per_node N $(which snip) train ...``, every process reads its
``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` from the environment; a plain ``python`` launch is a
world of one and never touches ``torch.distributed``. Backend: NCCL on GPUs, gloo on CPUs.

We average gradients by hand (one flattened ``all_reduce`` after the last micro-step) instead of
wrapping the model in ``DistributedDataParallel``: the precision planner swaps and re-configures
``QLinear`` modules during training, which DDP's bucket bookkeeping does not expect, and the
explicit reduction makes "N ranks == one rank with the same global batch" easy to see. Rank 0
alone writes logs, plans, checkpoints and the report.

Stopping together: every rank decides to stop at the same step (`any_rank` on Ctrl-C/SIGTERM,
and the non-finite check sees the all-reduced loss), and `barrier` after each checkpoint keeps
the other ranks alive until rank 0's save is on disk -- otherwise torchrun, seeing a rank exit,
would kill rank 0 mid-save. Every collective has a timeout (``--dist.timeout``, seconds, given
to ``init_process_group``): a hung or dead peer ends the run with `PeerError` (a one-line error)
instead of blocking forever; the last checkpoint on disk is complete (saves are atomic).
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from snip.errors import UserError

# Messages of torch.distributed errors that mean "a peer is hung or gone", not a bug.
PEER_FAILURES = ("timed out", "timeout", "connection closed", "connection reset", "broken pipe")


class PeerError(UserError):
    """A collective timed out or lost its peer: another rank hung or died."""


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


def setup(device_type: str, timeout: float | None = None) -> DistInfo:
    """Join the process group described by torchrun's environment variables (if any); every
    collective then fails after ``timeout`` seconds instead of waiting forever."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DistInfo()
    info = DistInfo(rank=int(os.environ["RANK"]), local_rank=int(os.environ.get("LOCAL_RANK", 0)),
                    world_size=world_size)
    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        kw = {"timeout": datetime.timedelta(seconds=timeout)} if timeout else {}
        dist.init_process_group(backend=backend, **kw)
    return info


@contextlib.contextmanager
def collective(info: DistInfo, what: str) -> Iterator[None]:
    """Turn a peer's timeout or death inside a collective into a one-line `PeerError`."""
    try:
        yield
    except RuntimeError as e:
        if not any(m in str(e).lower() for m in PEER_FAILURES):
            raise
        raise PeerError(f"rank {info.rank}: {what} failed ({str(e).splitlines()[0][:200]}): "
                        "another rank is hung or died (see --dist.timeout); the last saved "
                        "checkpoint is intact, continue with --resume") from None


def barrier(info: DistInfo, what: str = "barrier") -> None:
    """Wait for every rank (a no-op in a world of one)."""
    if info.enabled:
        with collective(info, what):
            dist.barrier()


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
    with collective(info, "the gradient all-reduce"):
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= info.world_size
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def mean_over_ranks(value: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.enabled:
        value = value.clone()
        with collective(info, "the loss all-reduce"):
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
    with collective(info, "agreeing on whether to stop"):
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())
