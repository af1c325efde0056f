"""Checkpoints that resume exactly and survive being killed mid-write.

A checkpoint is one directory ``checkpoints/step_<N>/`` (N = optimizer steps completed)::

    model.safetensors   weights (tied tensors stored once)
    optimizer.pt        torch optimizer state_dict (AdamW moments and step counts)
    rng.pt              torch CPU/CUDA, numpy and Python RNG states
    controller.pt       the precision controller's state_dict (adaptive runs)
    writeback.pt        the weight write-back state (``--writeback.policy`` other than none):
                        masters, the stochastic-rounding generator, audit counters
    plan.json           the precision plan in force
    config.toml         the run's resolved config
    tokenizer.json      the tokenizer (`snip.data.load_tokenizer` reads it; `tokenizer_of`),
                        so sampling and export need neither the corpus nor its tokenizer file
    meta.json           step, counters, model shape, tokenizer, and a manifest (size + sha256 of
                        every other file); written last

Exact resume needs everything that decides the next loss: weights, optimizer moments, the RNG
streams, the plan and the data position. The data pipeline is a pure function of the step, so
the step *is* the data position.

Atomicity: everything is written into a hidden ``.tmp-step_<N>-<pid>`` directory, fsynced, and
then renamed into place with ``os.replace``; a rename is atomic on POSIX, so a kill at any moment
leaves either the old set of checkpoints or the new one, never a half-written ``step_<N>``.
Leftover temporary directories are ignored and cleaned up by the next save. Loading verifies the
manifest, so a checkpoint damaged later (disk full, copied halfway) is reported by name together
with the newest older checkpoint that is still good.

Re-saving a step that exists (a resumed run reaching a step it had saved before) needs two
renames: ``step_<N>`` -> ``.old-step_<N>-<pid>``, then ``.tmp-...`` -> ``step_<N>``. A kill
between them leaves both copies hidden, so `find` (what ``--resume`` uses) first calls `recover`:
a hidden copy of a missing step whose manifest verifies, left by a process that is no longer
alive, is renamed back into place (the new ``.tmp-`` copy preferred over the ``.old-`` one).

A full disk while saving removes the partial temporary directory and raises a one-line
`CheckpointError` naming the file and the space needed; the earlier checkpoints are untouched.

Sharded checkpoints (``--dist.strategy fsdp``, `save_sharded`): every rank writes its shards of
the weights and of the optimizer state with `torch.distributed.checkpoint` (DCP) into
``sharded/`` of the same temporary directory, and its RNG state to ``rng_rank<R>.pt``; rank 0
adds a consolidated ``model.safetensors`` (what ``snip export``, ``snip sample`` and ``snip plan``
read), the plan, config, controller and meta.json with the manifest of every file, then renames
the directory into place after a barrier: the same atomicity as above. DCP records the global
shape of every tensor, so a sharded checkpoint loads into any world size or strategy -- and
into one process (`load_state`); a single-file checkpoint loads into an FSDP run through the
full-state-dict path (`load_full_into_sharded`).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model
from torch import nn

from snip.errors import MissingFileError, UserError
from snip.train.rundir import pid_alive

PREFIX = "step_"
SHARDED = "sharded"  # the torch.distributed.checkpoint directory of a sharded checkpoint
# Test hook: "STEP:SECONDS" sleeps inside the write of checkpoint STEP (after the weights are
# written, before the rename), so a test can kill the process exactly there.
TOKENIZER_FILE = "tokenizer.json"


class CheckpointError(UserError):
    """A checkpoint that cannot be used (user-facing: exit code 2 from the CLI)."""


class CheckpointRemoved(CheckpointError):
    """The checkpoint disappeared while being read: a live run rotated it (not corrupt)."""


@dataclass(frozen=True)
class Meta:
    """What ``meta.json`` records beside the step and the manifest: enough to check that a
    checkpoint fits a model and tokenizer, and to continue its counters and schedule.
    (A checkpoint written before a field existed reads as that field's default.)"""

    model: dict[str, Any]  # `ModelConfig.to_dict()` of the trained model
    tokenizer: str  # the data's tokenizer name (`Batches.tokenizer`)
    vocab_size: int
    skipped: int = 0  # non-finite steps skipped so far
    world_size: int = 1
    strategy: str = "none"  # dist.strategy of a multi-process run ("none": one process)
    schedule: dict[str, Any] | None = None  # `Schedule.to_dict()`: where the decay is anchored

    def to_dict(self) -> dict[str, Any]:
        return {"skipped": self.skipped, "world_size": self.world_size,
                "strategy": self.strategy, "model": dict(self.model),
                "tokenizer": self.tokenizer, "vocab_size": self.vocab_size,
                "schedule": self.schedule}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Meta:
        return cls(model=dict(d.get("model") or {}), tokenizer=str(d.get("tokenizer", "")),
                   vocab_size=int(d.get("vocab_size", 0)), skipped=int(d.get("skipped", 0)),
                   world_size=int(d.get("world_size", 1)),
                   strategy=str(d.get("strategy", "none")), schedule=d.get("schedule"))


@dataclass
class Checkpoint:
    path: Path
    step: int
    meta: Meta
    plan: dict[str, Any]
    optimizer: dict[str, Any]
    rng: dict[str, Any]
    controller: dict[str, Any] | None
    writeback: dict[str, Any] | None = None
    config_toml: str = ""  # the run's config.toml (with its history) when it was saved

    @property
    def sharded(self) -> bool:
        """Written by an FSDP run: weights and optimizer state live in ``sharded/`` (DCP)."""
        return (self.path / SHARDED).is_dir()

    def rng_of(self, rank: int) -> dict[str, Any]:
        """The RNG state rank ``rank`` saved (sharded checkpoints keep one per rank; a rank the
        saving run did not have, and every single-file checkpoint, gets rank 0's)."""
        own = self.path / f"rng_rank{rank}.pt"
        return torch.load(own, weights_only=False) if own.is_file() else self.rng

    def load_weights(self, model: nn.Module) -> None:
        missing, unexpected = load_model(model, self.path / "model.safetensors", strict=False)
        if missing or unexpected:
            raise CheckpointError(f"checkpoint {self.path} does not fit this model (missing "
                                  f"{sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")


def step_dir(root: Path, step: int) -> Path:
    return root / f"{PREFIX}{step:06d}"


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first (temporary directories excluded)."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX)
             and p.name[len(PREFIX):].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


# --------------------------------------------------------------------------------------------
# Saving


def capture_rng() -> dict[str, Any]:
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "python": list(random.getstate()[1]) + [random.getstate()[0]] + [random.getstate()[2]],
    }


def restore_rng(rng: dict[str, Any]) -> None:
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    kind, keys, *rest = rng["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), *rest))
    *internal, version, gauss = rng["python"]
    random.setstate((version, tuple(internal), gauss))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(root: Path, step: int, *, model: nn.Module, optimizer: torch.optim.Optimizer,
         plan: dict[str, Any], config_toml: str, meta: Meta,
         tokenizer: dict[str, Any] | None = None, controller: dict[str, Any] | None = None,
         writeback: dict[str, Any] | None = None, keep: int | None = None) -> Path:
    """Write checkpoint ``step`` atomically, then keep only the newest ``keep``.
    ``tokenizer``: the data tokenizer's ``to_dict()`` (None: token data without one)."""
    root.mkdir(parents=True, exist_ok=True)
    final = step_dir(root, step)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _write(tmp, step, model=model, optimizer=optimizer, plan=plan, config_toml=config_toml,
               meta=meta, tokenizer=tokenizer, controller=controller, writeback=writeback)
    except (OSError, RuntimeError, SafetensorError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        needed = _estimate_bytes(model, optimizer)
        # torch.save and safetensors report a full disk as RuntimeError/SafetensorError
        full = getattr(e, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or (
            not isinstance(e, OSError) and shutil.disk_usage(root).free < needed)
        if not full:
            raise
        earlier = [p for p in list_checkpoints(root) if p != final]
        after = ("earlier checkpoints are intact: free some space and continue with --resume"
                 if earlier else "no checkpoint of this run was saved yet: free some space "
                 "and start it again")
        raise CheckpointError(
            f"no space left on device writing checkpoint {final} "
            f"({getattr(e, 'filename', None) or tmp}; the "
            f"checkpoint needs about {needed:,} bytes); {after}") from None
    _replace_dir(tmp, final)
    _fsync(root)
    _cleanup(root, keep)
    return final


def _estimate_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    states = sum(v.numel() * v.element_size() for s in optimizer.state.values()
                 for v in s.values() if isinstance(v, torch.Tensor))
    return weights + states


def _write(tmp: Path, step: int, *, model: nn.Module, optimizer: torch.optim.Optimizer,
           plan: dict[str, Any], config_toml: str, meta: Meta, tokenizer: dict[str, Any] | None,
           controller: dict[str, Any] | None, writeback: dict[str, Any] | None) -> None:
    """Every file of a checkpoint into ``tmp``, meta.json (the manifest) last, all fsynced."""
    tmp.mkdir()
    save_model(model, str(tmp / "model.safetensors"))
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(capture_rng(), tmp / "rng.pt")
    if controller is not None:
        torch.save(controller, tmp / "controller.pt")
    if writeback is not None:
        torch.save(writeback, tmp / "writeback.pt")
    (tmp / "plan.json").write_text(json.dumps(plan, indent=2) + "\n")
    (tmp / "config.toml").write_text(config_toml)
    _finish(tmp, step, meta, tokenizer)


def _finish(tmp: Path, step: int, meta: Meta, tokenizer: dict[str, Any] | None) -> None:
    """The tokenizer file, then meta.json with the manifest of every file under ``tmp``
    (written last), all fsynced."""
    if tokenizer is not None:
        (tmp / TOKENIZER_FILE).write_text(json.dumps(tokenizer))
    files = sorted(p for p in tmp.rglob("*") if p.is_file())
    manifest = {str(p.relative_to(tmp)): {"size": p.stat().st_size, "sha256": _sha256(p)}
                for p in files}
    (tmp / "meta.json").write_text(json.dumps(
        {**meta.to_dict(), "step": step, "files": manifest}, indent=2) + "\n")
    for p in (*files, tmp / "meta.json"):
        _fsync(p)
    for d in (p for p in tmp.rglob("*") if p.is_dir()):
        _fsync(d)
    _fsync(tmp)


def _train_state(model: nn.Module, optimizer: torch.optim.Optimizer,
                 full: bool = False) -> dict[str, Any]:
    """Weights and optimizer state keyed by parameter name (FQN), in the model's own layout
    (DTensor shards under FSDP) or, with ``full``, as whole tensors on the CPU."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=full, cpu_offload=full)
    weights, optim = get_state_dict(model, optimizer, options=options)
    return {"model": weights, "optim": optim}


def save_sharded(root: Path, step: int, *, rank: int, model: nn.Module,
                 optimizer: torch.optim.Optimizer, plan: dict[str, Any], config_toml: str,
                 meta: Meta, tokenizer: dict[str, Any] | None = None,
                 controller: dict[str, Any] | None = None,
                 writeback: dict[str, Any] | None = None, keep: int | None = None) -> Path:
    """Write sharded checkpoint ``step`` from every rank (a collective: call it on all ranks
    together), atomically as `save`; returns its directory (on every rank)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    root.mkdir(parents=True, exist_ok=True)
    final = step_dir(root, step)
    name = [f".tmp-{final.name}-{os.getpid()}"]
    dist.broadcast_object_list(name, src=0)  # rank 0's pid names the shared temporary dir
    tmp = root / name[0]
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    dist.barrier()
    try:
        dcp.save(_train_state(model, optimizer), checkpoint_id=str(tmp / SHARDED))
        torch.save(capture_rng(), tmp / f"rng_rank{rank}.pt")
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                    cpu_offload=True))
        if rank == 0:
            save_file({k: v.contiguous().clone() for k, v in full.items()},  # tied: 2 copies
                      str(tmp / "model.safetensors"))
            torch.save(capture_rng(), tmp / "rng.pt")
            if controller is not None:
                torch.save(controller, tmp / "controller.pt")
            if writeback is not None:  # whole tensors, the same on every rank
                torch.save(writeback, tmp / "writeback.pt")
            (tmp / "plan.json").write_text(json.dumps(plan, indent=2) + "\n")
            (tmp / "config.toml").write_text(config_toml)
        dist.barrier()  # every rank's files are written
        if rank == 0:
            _finish(tmp, step, meta, tokenizer)
            _replace_dir(tmp, final)
            _fsync(root)
            _cleanup(root, keep)
    except BaseException:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def load_state(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Load a sharded checkpoint's weights and optimizer state into ``model``/``optimizer``,
    whatever their layout: FSDP shards of any world size, DDP replicas, or one process (DCP
    reshards by the global shapes it recorded)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = _train_state(model, optimizer)
    try:
        with warnings.catch_warnings():  # "... assuming the intent is to load in a single
            warnings.simplefilter("ignore", UserWarning)  # process": it is
            dcp.load(state, checkpoint_id=str(path / SHARDED),
                     no_dist=not (dist.is_available() and dist.is_initialized()))
    except (RuntimeError, ValueError, KeyError) as e:
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"checkpoint {path} does not fit this model and optimizer "
                              f"({first})") from None
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])


def full_optimizer_state(model: nn.Module, optimizer_state: dict[str, Any],
                         make_optimizer: Any) -> dict[str, Any]:
    """A single-file checkpoint's optimizer state (keyed by parameter index) keyed by parameter
    name instead, for `load_full_into_sharded`; ``make_optimizer(model)`` builds an optimizer
    with the run's parameter groups over the (not yet sharded) ``model``."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    optimizer = make_optimizer(model)
    optimizer.load_state_dict(optimizer_state)
    return get_optimizer_state_dict(model, optimizer,
                                    options=StateDictOptions(full_state_dict=True))


def load_full_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer,
                        optim: dict[str, Any]) -> None:
    """Name-keyed whole optimizer state (`full_optimizer_state`) into the optimizer of an FSDP
    model: every rank keeps its own shards. (The weights were loaded before sharding.)"""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, optim,
                             options=StateDictOptions(full_state_dict=True))


def _replace_dir(tmp: Path, final: Path) -> None:
    # os.replace cannot rename over a non-empty directory: move the old one aside first (only
    # happens when a resumed run re-saves a step it had saved before).
    if final.exists():
        old = final.with_name(f".old-{final.name}-{os.getpid()}")
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)


def _cleanup(root: Path, keep: int | None) -> None:
    for p in root.iterdir():
        if p.name.startswith((".tmp-", ".old-")) and not p.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(p, ignore_errors=True)
    if keep:
        for p in list_checkpoints(root)[:-keep]:
            shutil.rmtree(p, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# Loading


def _check(path: Path) -> dict[str, Any]:
    """meta.json of ``path`` after checking every file against its manifest."""
    try:
        meta = json.loads((path / "meta.json").read_text())
        manifest = meta["files"]
        if not isinstance(manifest, dict) or "model.safetensors" not in manifest or not all(
                isinstance(e, dict) and isinstance(e.get("size"), int)
                and isinstance(e.get("sha256"), str) for e in manifest.values()):
            raise ValueError("malformed manifest")
    except (OSError, ValueError, KeyError, TypeError) as e:
        if not path.is_dir():
            raise CheckpointRemoved(f"checkpoint {path} was removed while it was read (a "
                                    "running training rotated it)") from None
        raise CheckpointError(f"checkpoint {path} is incomplete or corrupt (meta.json: "
                              f"{type(e).__name__}{': ' + str(e) if str(e) else ''})") from None
    for name, entry in manifest.items():
        f = path / name
        try:
            good = f.is_file() and f.stat().st_size == entry["size"] \
                and _sha256(f) == entry["sha256"]
        except OSError:
            good = False
        if not good:
            if not path.is_dir():
                raise CheckpointRemoved(f"checkpoint {path} was removed while it was read (a "
                                        "running training rotated it)")
            raise CheckpointError(f"checkpoint {path} is corrupt or truncated ({name} does not "
                                  "match its manifest)")
    return meta


def verify(path: Path) -> dict[str, Any]:
    """Like `_check`, and a failure names the newest older checkpoint that is still good."""
    try:
        return _check(path)
    except CheckpointRemoved:
        raise
    except CheckpointError as e:
        raise CheckpointError(f"{e}{_previous_hint(path)}") from None


def _previous_hint(path: Path) -> str:
    older = [p for p in list_checkpoints(path.parent) if p.name < path.name]
    for p in reversed(older):
        try:
            _check(p)
        except CheckpointError:
            continue
        return f"; the previous good checkpoint is {p} (resume with --resume {p})"
    return "; no older good checkpoint exists"


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # our own leftovers from an earlier run in this process
    return pid_alive(pid)


def recover(root: Path) -> list[Path]:
    """Put back checkpoints left hidden by a kill between the two renames of a re-save.

    For every step whose ``step_<N>`` is missing but which has a hidden ``.tmp-``/``.old-``
    copy from a dead process with a verified manifest, rename that copy into place (the newer
    ``.tmp-`` first). Returns the recovered directories."""
    if not root.is_dir():
        return []
    recovered = []
    candidates = sorted((p for p in root.iterdir() if p.is_dir() and p.name.startswith(
        (".tmp-", ".old-"))), key=lambda p: not p.name.startswith(".tmp-"))
    for hidden in candidates:
        kind, rest = hidden.name[1:].split("-", 1)
        name, _, pid = rest.rpartition("-")
        if not (name.startswith(PREFIX) and pid.isdigit()) or _alive(int(pid)):
            continue
        final = root / name
        if final.exists():
            continue
        try:
            _check(hidden)
        except CheckpointError:
            continue
        os.replace(hidden, final)
        _fsync(root)
        recovered.append(final)
    return recovered


def find(path: Path, flag: str = "--resume") -> Path:
    """A checkpoint directory from a run directory (its newest checkpoint) or a checkpoint;
    errors name ``flag``, the option that gave the path.

    Hidden complete copies left by a killed re-save are recovered first (`recover`)."""
    path = Path(path)
    if not path.exists():
        raise MissingFileError(f"{flag}: {path} does not exist")
    if (path / "meta.json").is_file() or path.name.startswith(PREFIX):
        return path
    recover(path / "checkpoints")
    found = list_checkpoints(path / "checkpoints")
    if not found:
        inner = list_checkpoints(path)
        if inner:  # a run's checkpoints directory itself
            raise MissingFileError(f"{flag}: {path} is a directory of checkpoints; pass its "
                                   f"run directory {path.parent} (the newest checkpoint) or "
                                   f"one checkpoint, e.g. {inner[-1]}")
        raise MissingFileError(f"{flag}: {path} has no checkpoints (expected "
                               f"{path / 'checkpoints'}/{PREFIX}<N>)")
    return found[-1]


def tokenizer_of(path: Path) -> Any:
    """The tokenizer a checkpoint holds (`snip.data.Tokenizer`); for a checkpoint written
    before checkpoints held one, the byte tokenizer if that is what it records, else None."""
    from snip.data import ByteTokenizer, load_tokenizer

    f = Path(path) / TOKENIZER_FILE
    if f.is_file():
        return load_tokenizer(f)
    recorded = str(verify(Path(path)).get("tokenizer", ""))
    return ByteTokenizer() if recorded == "byte" or recorded.startswith("ByteTokenizer:") else None


def load(path: Path) -> Checkpoint:
    """Verify and read a checkpoint (weights are loaded later by `Checkpoint.load_weights`)."""
    meta = verify(path)
    try:
        controller = None
        if (path / "controller.pt").is_file():
            controller = torch.load(path / "controller.pt", weights_only=False)
        writeback = None
        if (path / "writeback.pt").is_file():
            writeback = torch.load(path / "writeback.pt", weights_only=True)
        return Checkpoint(
            path=path, step=int(meta["step"]), meta=Meta.from_dict(meta),
            plan=json.loads((path / "plan.json").read_text()),
            optimizer=(torch.load(path / "optimizer.pt", weights_only=True)
                       if (path / "optimizer.pt").is_file() else {}),
            rng=torch.load(path / "rng.pt", weights_only=False), controller=controller,
            writeback=writeback, config_toml=(path / "config.toml").read_text())
    except (OSError, RuntimeError, ValueError, SafetensorError) as e:
        if not path.is_dir():
            raise CheckpointRemoved(f"checkpoint {path} was removed while it was read (a "
                                    "running training rotated it)") from None
        raise CheckpointError(f"checkpoint {path} cannot be read ({e})"
                              f"{_previous_hint(path)}") from None
