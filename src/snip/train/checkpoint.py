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
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model
from torch import nn

from snip.errors import MissingFileError, UserError

PREFIX = "step_"
# Test hook: "STEP:SECONDS" sleeps inside the write of checkpoint STEP (after the weights are
# written, before the rename), so a test can kill the process exactly there.
PAUSE_ENV = "SNIP_CHECKPOINT_PAUSE"


class CheckpointError(UserError):
    """A checkpoint that cannot be used (user-facing: exit code 2 from the CLI)."""


@dataclass
class Checkpoint:
    path: Path
    step: int
    meta: dict[str, Any]
    plan: dict[str, Any]
    optimizer: dict[str, Any]
    rng: dict[str, Any]
    controller: dict[str, Any] | None
    writeback: dict[str, Any] | None = None
    config_toml: str = ""  # the run's config.toml (with its history) when it was saved

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


def _maybe_pause(step: int) -> None:
    spec = os.environ.get(PAUSE_ENV, "")
    if spec and int(spec.split(":")[0]) == step:
        print(f"[{PAUSE_ENV}] pausing inside checkpoint write of step {step}", flush=True)
        time.sleep(float(spec.split(":")[1]))


def save(root: Path, step: int, *, model: nn.Module, optimizer: torch.optim.Optimizer,
         plan: dict[str, Any], config_toml: str, meta: dict[str, Any],
         controller: dict[str, Any] | None = None, writeback: dict[str, Any] | None = None,
         keep: int | None = None) -> Path:
    """Write checkpoint ``step`` atomically, then keep only the newest ``keep``."""
    root.mkdir(parents=True, exist_ok=True)
    final = step_dir(root, step)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _write(tmp, step, model=model, optimizer=optimizer, plan=plan, config_toml=config_toml,
               meta=meta, controller=controller, writeback=writeback)
    except (OSError, RuntimeError, SafetensorError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        needed = _estimate_bytes(model, optimizer)
        # torch.save and safetensors report a full disk as RuntimeError/SafetensorError
        full = getattr(e, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or (
            not isinstance(e, OSError) and shutil.disk_usage(root).free < needed)
        if not full:
            raise
        raise CheckpointError(
            f"no space left on device writing checkpoint {final} "
            f"({getattr(e, 'filename', None) or tmp}; the "
            f"checkpoint needs about {needed:,} bytes); earlier "
            "checkpoints are intact: free some space and continue with --resume") from None
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
           plan: dict[str, Any], config_toml: str, meta: dict[str, Any],
           controller: dict[str, Any] | None, writeback: dict[str, Any] | None) -> None:
    """Every file of a checkpoint into ``tmp``, meta.json (the manifest) last, all fsynced."""
    tmp.mkdir()
    save_model(model, str(tmp / "model.safetensors"))
    _maybe_pause(step)
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(capture_rng(), tmp / "rng.pt")
    if controller is not None:
        torch.save(controller, tmp / "controller.pt")
    if writeback is not None:
        torch.save(writeback, tmp / "writeback.pt")
    (tmp / "plan.json").write_text(json.dumps(plan, indent=2) + "\n")
    (tmp / "config.toml").write_text(config_toml)
    files = sorted(p for p in tmp.iterdir())
    manifest = {p.name: {"size": p.stat().st_size, "sha256": _sha256(p)} for p in files}
    (tmp / "meta.json").write_text(json.dumps({**meta, "step": step, "files": manifest},
                                              indent=2) + "\n")
    for p in tmp.iterdir():
        _fsync(p)
    _fsync(tmp)


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
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"checkpoint {path} is incomplete or corrupt (meta.json: "
                              f"{type(e).__name__})") from None
    for name, entry in manifest.items():
        f = path / name
        if not f.is_file() or f.stat().st_size != entry["size"] or _sha256(f) != entry["sha256"]:
            raise CheckpointError(f"checkpoint {path} is corrupt or truncated ({name} does not "
                                  "match its manifest)")
    return meta


def verify(path: Path) -> dict[str, Any]:
    """Like `_check`, and a failure names the newest older checkpoint that is still good."""
    try:
        return _check(path)
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
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
        raise MissingFileError(f"{flag}: {path} has no checkpoints (expected "
                               f"{path / 'checkpoints'}/{PREFIX}<N>)")
    return found[-1]


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
            path=path, step=int(meta["step"]), meta=meta,
            plan=json.loads((path / "plan.json").read_text()),
            optimizer=torch.load(path / "optimizer.pt", weights_only=True),
            rng=torch.load(path / "rng.pt", weights_only=False), controller=controller,
            writeback=writeback, config_toml=(path / "config.toml").read_text())
    except (OSError, RuntimeError, ValueError, SafetensorError) as e:
        raise CheckpointError(f"checkpoint {path} cannot be read ({e})"
                              f"{_previous_hint(path)}") from None
