"""Data parallelism on PyTorch's own engines: DDP and FSDP2, over torch.distributed.

Launched by ``torchrun --nproc_per_node N $(which snip) train ...``, every process reads its
``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` from the environment; a plain ``python`` launch is a
world of one and never touches ``torch.distributed``. Backend: NCCL on GPUs, gloo on CPUs.

Two strategies (``--dist.strategy``, `Strategy`), both "N ranks == one rank with the same global
batch" up to float rounding:

* ``ddp`` (the default): `torch.nn.parallel.DistributedDataParallel` keeps a full replica on every
  rank and averages gradients in buckets during the backward pass (``no_sync`` on all but the
  last micro-batch of a step). The planner only re-configures ``QLinear`` formats in place
  (`PrecisionPlan.apply` never swaps parameters), which DDP's buckets do not see.
* ``fsdp``: FSDP2 (`torch.distributed.fsdp.fully_shard`) on every transformer block and on the
  root. Parameters are sharded along dim 0 (DTensors); in forward/backward FSDP all-gathers each
  block's parameters, so ``QLinear``'s three quantized GEMMs see the unsharded weight exactly as
  in one process, and gradients are reduce-scattered back to shards. Optional mixed precision
  (``--dist.mixed_precision bf16``: bf16 compute copies, fp32 gradient reduction) and CPU offload
  of the shards and optimizer (``--dist.cpu_offload``). Checkpoints are sharded
  (`torch.distributed.checkpoint`, see `snip.train.checkpoint`).

The trainer keeps the bare model (``Trainer.model``: state dicts, plans, the controller) and
calls the wrapper returned by `wrap` for training forwards. Rank 0 alone writes logs, plans and
the report; checkpoints are written by rank 0 (DDP) or by every rank (FSDP shards).

Stopping together: every rank decides to stop at the same step (`any_rank` on Ctrl-C/SIGTERM,
and the non-finite check sees the all-reduced loss), and `barrier` after each checkpoint keeps
the other ranks alive until the save is on disk -- otherwise torchrun, seeing a rank exit,
would kill rank 0 mid-save. Every collective has a timeout (``--dist.timeout``, seconds, given
to ``init_process_group``): a hung or dead peer ends the run with `PeerError` (a one-line error)
instead of blocking forever; the last checkpoint on disk is complete (saves are atomic).
"""

from __future__ import annotations

import contextlib
import datetime
import enum
import gc
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from snip.errors import UserError

T = TypeVar("T")
# Messages of torch.distributed errors that mean "a peer is hung or gone", not a bug.
PEER_FAILURES = ("timed out", "timeout", "connection closed", "connection reset", "broken pipe")


class PeerError(UserError):
    """A collective timed out or lost its peer: another rank hung or died."""


class Strategy(enum.Enum):
    """How the model is spread over the ranks (``--dist.strategy``)."""

    DDP = "ddp"    # a full replica per rank, gradients all-reduced (DistributedDataParallel)
    FSDP = "fsdp"  # parameters, gradients and optimizer state sharded (FSDP2, fully_shard)


class MixedPrecision(enum.Enum):
    """FSDP's compute dtype (``--dist.mixed_precision``); gradients are reduced in fp32."""

    NONE = "none"
    BF16 = "bf16"


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


def from_env(strategy: Strategy = Strategy.DDP) -> DistInfo:
    """This process's place in the world, from torchrun's environment variables (a world of one
    without them); joins nothing yet (see `join`), so a bad setting fails before any collective.
    FSDP needs a process group: without one it is a `UserError`."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        if strategy is Strategy.FSDP:
            raise UserError("dist.strategy=fsdp needs a process group of 2 or more ranks: launch "
                            "with torchrun --nproc_per_node N, or pass --dist.strategy ddp (the "
                            "default: plain training in one process; an FSDP run resumes or "
                            "branches in one process that way)")
        return DistInfo()
    return DistInfo(rank=int(os.environ["RANK"]), local_rank=int(os.environ.get("LOCAL_RANK", 0)),
                    world_size=world_size)


def join(info: DistInfo, device_type: str, timeout: float | None = None) -> None:
    """Join the process group (NCCL on CUDA, gloo on CPU) unless in a world of one; every
    collective then fails after ``timeout`` seconds instead of waiting forever."""
    if info.enabled and not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        kw = {"timeout": datetime.timedelta(seconds=timeout)} if timeout else {}
        dist.init_process_group(backend=backend, **kw)


def setup(device_type: str, timeout: float | None = None,
          strategy: Strategy = Strategy.DDP) -> DistInfo:
    """`from_env`, then `join`."""
    info = from_env(strategy)
    join(info, device_type, timeout)
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
    """Leave the process group.  Drop every DDP wrapper first: its C++ reducer holds a reference
    to the group and is freed with the GIL held, so if it dropped the *last* reference, gloo's
    destructor would join worker threads that may still need the GIL to free a finished
    all-reduce's tensors -- a deadlock at exit (pytorch/pytorch#56297).  Collecting here frees a
    dropped wrapper now, while the group is still registered; the group itself is then freed by
    its Python handle, which releases the GIL."""
    if info.enabled and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


def broadcast_parameters(model: nn.Module, info: DistInfo) -> None:
    """Make every rank start from rank 0's weights (seeded init already agrees; this is cheap
    insurance against an init that reads a per-rank random stream)."""
    if info.enabled:
        for t in model.state_dict().values():
            dist.broadcast(t, src=0)


def wrap(model: nn.Module, info: DistInfo, strategy: Strategy, *,
         mixed_precision: MixedPrecision = MixedPrecision.NONE,
         cpu_offload: bool = False) -> nn.Module:
    """The module to call for training forwards: ``model`` itself in a world of one, a DDP
    wrapper, or ``model`` sharded in place by FSDP2 (each block in ``model.layers``, then the
    root: embeddings, final norm and head, tied or not). Build the optimizer afterwards: FSDP
    replaces the parameters by sharded DTensors."""
    if not info.enabled:
        return model
    if strategy is Strategy.DDP:
        from torch.nn.parallel import DistributedDataParallel

        device = next(model.parameters()).device
        ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
    )

    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if mixed_precision is MixedPrecision.BF16 else MixedPrecisionPolicy())
    on_gpu = next(model.parameters()).device.type == "cuda"
    offload = CPUOffloadPolicy() if cpu_offload and on_gpu else OffloadPolicy()  # CPU: no-op
    for block in getattr(model, "layers", ()):
        fully_shard(block, mp_policy=mp, offload_policy=offload)
    fully_shard(model, mp_policy=mp, offload_policy=offload)
    return model


def is_sharded(model: nn.Module) -> bool:
    """True if FSDP2 has sharded ``model`` (its parameters are DTensors)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


@contextlib.contextmanager
def gradient_sync(wrapper: nn.Module, sync: bool) -> Iterator[None]:
    """Reduce gradients in this backward (``sync``) or only accumulate them locally (the
    micro-batches of a step before its last): one reduction per optimizer step."""
    if sync or not isinstance(wrapper, nn.Module):
        yield
        return
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(wrapper, DistributedDataParallel):
        with wrapper.no_sync():
            yield
    elif is_sharded(wrapper):
        wrapper.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            wrapper.set_requires_gradient_sync(True)
    else:
        yield


def full_replica(model: nn.Module, optimizer: torch.optim.Optimizer,
                 build: Callable[[], tuple[nn.Module, torch.optim.Optimizer]],
                 ) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A whole, unsharded copy of an FSDP ``model`` and its ``optimizer`` on every rank (a
    collective): ``build()`` makes a fresh bare model and optimizer, which get the gathered
    weights and optimizer state. The precision controller measures on it (its statistics need
    whole weights and Adam moments); it costs one full copy per rank while it lives."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_state_dict,
        set_state_dict,
    )

    weights, optim = get_state_dict(model, optimizer,
                                    options=StateDictOptions(full_state_dict=True))
    bare, bare_optimizer = build()
    set_state_dict(bare, bare_optimizer, model_state_dict=weights, optim_state_dict=optim,
                   options=StateDictOptions(full_state_dict=True))
    return bare, bare_optimizer


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor: the full value of a (replicated or partial) DTensor, else ``t``."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def mean_over_ranks(value: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.enabled:
        value = value.clone()
        with collective(info, "the loss all-reduce"):
            dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= info.world_size
    return value


def from_rank0(value: T | None, info: DistInfo, encode: Callable[[T], Any],
               decode: Callable[[Any], T]) -> T | None:
    """Rank 0's ``value`` (or None) on every rank, sent in its ``encode``d form."""
    if not info.enabled:
        return value
    box = [None if value is None else encode(value)]
    with collective(info, "sharing rank 0's decision"):
        dist.broadcast_object_list(box, src=0)
    return None if box[0] is None else decode(box[0])


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
