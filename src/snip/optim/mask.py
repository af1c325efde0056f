"""Tiles and exact-budget tile masks: which coordinates keep an fp32 master.

**Tile geometry.**  A tile is a contiguous chunk of ``tile_size`` coordinates of the *flattened,
row-major* weight (``w.reshape(-1)``), 768 by default.  For a ``(out, in)`` Linear weight with
``in == tile_size`` a tile is one row; otherwise tiles run across row ends.  The last tile of a
tensor holds the remainder (``numel % tile_size``) when the size does not divide.

**Exact budget.**  A mask protects exactly ``B = round(fraction * N)`` coordinates, where ``N`` is
the eligible payload (the total ``numel`` of the eligible 2-D weights).  Tiles are taken whole in
ranking order; the first tile that no longer fits is truncated to its leading ``remaining``
coordinates, and selection stops there, so the coordinate count is exact.

**File format** (JSON, version 1)::

    {"version": 1, "kind": "snip.tile_mask", "tile_size": 768, "fraction": 0.1,
     "method": "reference |g*u|", "budget": 4915,
     "params": {"layers.0.attn.wq": {"shape": [64, 64], "tiles": [[3, 768], [7, 100]]}, ...}}

``tiles`` lists ``[tile_index, covered_coordinates]`` pairs.  Every eligible parameter of the
model is listed (possibly with no tiles), so :meth:`TileMask.check` can reject a mask made for a
different model with a clear error.  Masks are consumed by the ``selective_master`` policy
(:mod:`snip.optim.policies`); they are produced by :mod:`snip.audit.allocate`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from snip import jsonfile
from snip.errors import UserError

DEFAULT_TILE_SIZE = 768
MASK_VERSION = 1


def num_tiles(numel: int, tile_size: int) -> int:
    return math.ceil(numel / tile_size)


def tile_lengths(numel: int, tile_size: int) -> list[int]:
    """Coordinates per tile of a flattened tensor (the last one may be shorter)."""
    n = num_tiles(numel, tile_size)
    return [min(tile_size, numel - i * tile_size) for i in range(n)]


def tile_means(x: torch.Tensor, tile_size: int) -> torch.Tensor:
    """Mean of ``x`` over each flattened tile (the partial last tile averages its own length)."""
    flat = x.detach().reshape(-1).double()
    n = num_tiles(flat.numel(), tile_size)
    pad = n * tile_size - flat.numel()
    sums = torch.nn.functional.pad(flat, (0, pad)).view(n, tile_size).sum(1)
    lengths = torch.full((n,), float(tile_size), dtype=torch.float64, device=flat.device)
    if pad:
        lengths[-1] = tile_size - pad
    return sums / lengths


def _check_shapes(shapes: Mapping[str, Iterable[int]]) -> dict[str, tuple[int, ...]]:
    out = {}
    for name, shape in shapes.items():
        shape = tuple(int(s) for s in shape)
        if any(s < 0 for s in shape):
            raise UserError(f"parameter {name!r}: negative dimension in shape {shape}")
        out[str(name)] = shape
    return out


@dataclass(frozen=True, kw_only=True)
class TileMask:
    """Which tiles of which parameters keep an fp32 master; see the module docstring."""

    tile_size: int = DEFAULT_TILE_SIZE
    shapes: dict[str, tuple[int, ...]]
    tiles: dict[str, tuple[tuple[int, int], ...]]
    fraction: float = 0.0
    method: str = ""
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.tile_size, int) or self.tile_size < 1:
            raise UserError(f"tile_size must be a positive int, got {self.tile_size!r}")
        object.__setattr__(self, "shapes", _check_shapes(self.shapes))
        tiles = {}
        for name, pairs in self.tiles.items():
            if name not in self.shapes:
                raise UserError(f"mask lists tiles for {name!r} but has no shape for it")
            lengths = tile_lengths(math.prod(self.shapes[name]), self.tile_size)
            clean = tuple(sorted((int(i), int(c)) for i, c in pairs))
            for i, c in clean:
                if not 0 <= i < len(lengths) or not 0 < c <= lengths[i]:
                    raise UserError(f"mask tile ({i}, {c}) out of range for {name!r} with "
                                    f"{len(lengths)} tiles of {self.tile_size}")
            tiles[name] = clean
        object.__setattr__(self, "tiles", tiles)

    # ---- sizes ---------------------------------------------------------------------------
    @property
    def eligible(self) -> int:
        """Total coordinates of all parameters the mask was made for (the payload N)."""
        return sum(math.prod(s) for s in self.shapes.values())

    @property
    def protected(self) -> int:
        """Number of coordinates the mask protects."""
        return sum(c for pairs in self.tiles.values() for _, c in pairs)

    def indices(self, name: str) -> torch.Tensor:
        """Flat (row-major) coordinate indices protected in parameter ``name`` (int64, sorted)."""
        if name not in self.shapes:
            raise UserError(f"parameter {name!r} is not in this mask; mask parameters: "
                            f"{', '.join(self.shapes)}")
        parts = [torch.arange(i * self.tile_size, i * self.tile_size + c, dtype=torch.int64)
                 for i, c in self.tiles.get(name, ())]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)

    def dense(self, name: str) -> torch.Tensor:
        """Bool tensor shaped like the parameter, True where protected."""
        out = torch.zeros(math.prod(self.shapes[name]), dtype=torch.bool)
        out[self.indices(name)] = True
        return out.view(self.shapes[name])

    # ---- validation against a model ------------------------------------------------------
    def check(self, shapes: Mapping[str, Iterable[int]], source: str = "this mask") -> None:
        """Raise ``ValueError`` unless the mask was made for exactly these parameters."""
        want = _check_shapes(shapes)
        missing = sorted(set(want) - set(self.shapes))
        extra = sorted(set(self.shapes) - set(want))
        bad = [n for n in want if n in self.shapes and want[n] != self.shapes[n]]
        if not (missing or extra or bad):
            return
        parts = []
        if missing:
            parts.append(f"model parameters missing from the mask: {', '.join(missing[:5])}")
        if extra:
            parts.append(f"mask parameters not in the model: {', '.join(extra[:5])}")
        if bad:
            n = bad[0]
            parts.append(f"shape mismatch for {n!r}: mask {list(self.shapes[n])} vs model "
                         f"{list(want[n])}")
        raise UserError(f"{source} was made for a different model ({'; '.join(parts)}); "
                        f"rebuild it from a reference trace of this model (snip audit --mask-out)")

    # ---- file round trip -----------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"version": MASK_VERSION, "kind": "snip.tile_mask", "tile_size": self.tile_size,
                "fraction": self.fraction, "method": self.method, "budget": self.protected,
                "eligible": self.eligible, "meta": self.meta,
                "params": {n: {"shape": list(s), "tiles": [list(p) for p in self.tiles.get(n, ())]}
                           for n, s in self.shapes.items()}}

    @classmethod
    def from_dict(cls, d: Mapping, source: str = "mask") -> TileMask:
        if d.get("kind") != "snip.tile_mask" or d.get("version") != MASK_VERSION:
            raise UserError(f"{source}: not a snip tile mask version {MASK_VERSION} "
                            f"(kind={d.get('kind')!r}, version={d.get('version')!r})")
        params = d["params"]
        return cls(tile_size=int(d["tile_size"]), fraction=float(d.get("fraction", 0.0)),
                   method=str(d.get("method", "")), meta=dict(d.get("meta", {})),
                   shapes={n: p["shape"] for n, p in params.items()},
                   tiles={n: [tuple(t) for t in p["tiles"]] for n, p in params.items()})

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path

    @classmethod
    def load(cls, path: str | Path) -> TileMask:
        data = jsonfile.read_object(path, "mask file",
                                    hint="; build one with `snip audit --mask-out FILE`")
        return cls.from_dict(data, source=f"mask file {path}")


def full_mask(shapes: Mapping[str, Iterable[int]], tile_size: int = DEFAULT_TILE_SIZE) -> TileMask:
    """A mask protecting every coordinate (selective master == blanket master)."""
    shapes = _check_shapes(shapes)
    tiles = {n: list(enumerate(tile_lengths(math.prod(s), tile_size))) for n, s in shapes.items()}
    return TileMask(tile_size=tile_size, shapes=shapes, tiles=tiles, fraction=1.0, method="full")
