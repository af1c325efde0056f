"""Exact-budget fp32-master masks from tile scores, and same-budget controls.

The allocation question: with fp32 masters for only ``K %`` of the eligible 2-D weights, which
coordinates should get them?  The reference-guided answer ranks 768-coordinate tiles by the mean
*proposal contribution* ``|g * u|`` over an fp32 reference trace (``u`` = the proposal ``d``; a
first-order estimate of how much loss change the tile's updates carry) and protects the top
tiles.  Controls with exactly the same budget:

* ``random``: tiles in a seeded random order;
* ``matched_random``: random tiles with the composition of another mask (as many coordinates,
  and so tiles, in every tensor as it protects there): a control that differs from the
  reference mask only in *which* tiles of each tensor it picks;
* ``layers``: whole tensors in model order (first layers first), the last one truncated;
* ``freeze_only``: tiles ranked by how often the proxy says they are frozen, ignoring how much
  their updates matter (the paper's weakest arm).

Every mask is built by :func:`mask_from_scores`: sort tiles by score (descending), ties broken by
parameter order and then tile index, take tiles whole while they fit and truncate the first tile
that does not, so exactly ``round(fraction * N)`` coordinates are protected.  Masks are
:class:`~snip.optim.mask.TileMask` objects, consumed by the ``selective_master`` policy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from snip.audit.trace import ReferenceTrace
from snip.errors import UserError
from snip.optim.mask import DEFAULT_TILE_SIZE, TileMask, tile_lengths


def budget(fraction: float, eligible: int) -> int:
    """Protected coordinates for ``fraction`` of ``eligible`` (round half to even)."""
    if not 0.0 <= fraction <= 1.0:
        raise UserError(f"mask budget fraction must lie in [0, 1], got {fraction!r} "
                        f"(use 0.1 for 10 %)")
    return round(fraction * eligible)


def mask_from_scores(scores: Mapping[str, Sequence[float]], shapes: Mapping[str, Sequence[int]],
                     fraction: float, *, tile_size: int = DEFAULT_TILE_SIZE,
                     method: str = "scores", meta: dict | None = None) -> TileMask:
    """Top tiles by score covering exactly ``round(fraction * N)`` coordinates."""
    names = list(shapes)
    lengths = {n: tile_lengths(math.prod(shapes[n]), tile_size) for n in names}
    rows = []  # (score, param position, tile index)
    for pos, n in enumerate(names):
        s = np.asarray(scores[n], dtype=np.float64)
        if s.shape != (len(lengths[n]),):
            raise UserError(f"scores for {n!r} have shape {s.shape}, expected "
                            f"({len(lengths[n])},) tiles of {tile_size}")
        rows += [(s[i], pos, i) for i in range(len(s))]
    order = sorted(rows, key=lambda r: (-r[0], r[1], r[2]))
    left = budget(fraction, sum(math.prod(s) for s in shapes.values()))
    tiles: dict[str, list[tuple[int, int]]] = {n: [] for n in names}
    for _, pos, i in order:
        if left == 0:
            break
        take = min(left, lengths[names[pos]][i])
        tiles[names[pos]].append((i, take))
        left -= take
    return TileMask(tile_size=tile_size, shapes=dict(shapes), tiles=tiles, fraction=fraction,
                    method=method, meta=dict(meta or {}))


def reference_mask(trace: ReferenceTrace, fraction: float = 0.1) -> TileMask:
    """Top tiles by mean ``|g * d|`` over the trace's score steps (reference-guided)."""
    return mask_from_scores(trace.score, trace.shapes, fraction, tile_size=trace.tile_size,
                            method="reference |g*u|", meta={"score_steps": trace.score_steps})


def freeze_only_mask(trace: ReferenceTrace, fmt: str, fraction: float = 0.1) -> TileMask:
    """Tiles most often frozen under the proxy for ``fmt`` (contribution ignored)."""
    if fmt not in trace.freeze_score:
        raise UserError(f"trace has no freeze score for {fmt!r}; formats: {trace.formats}")
    return mask_from_scores(trace.freeze_score[fmt], trace.shapes, fraction,
                            tile_size=trace.tile_size, method=f"freeze-only {fmt}")


def random_mask(shapes: Mapping[str, Sequence[int]], fraction: float = 0.1, *, seed: int = 0,
                tile_size: int = DEFAULT_TILE_SIZE) -> TileMask:
    """Tiles in a seeded random order (same budget)."""
    rng = np.random.default_rng(seed)
    scores = {n: rng.random(len(tile_lengths(math.prod(s), tile_size))) for n, s in shapes.items()}
    return mask_from_scores(scores, shapes, fraction, tile_size=tile_size,
                            method=f"random seed={seed}")


def matched_random_mask(reference: TileMask, *, seed: int = 0) -> TileMask:
    """Random tiles with ``reference``'s composition: in every tensor as many tiles, covering as
    many coordinates each, as ``reference`` protects there, on tiles drawn uniformly (seeded)
    among that tensor's tiles (a count goes to a drawn tile long enough to hold it)."""
    rng = np.random.default_rng(seed)
    tiles: dict[str, list[tuple[int, int]]] = {}
    for name, shape in reference.shapes.items():
        lengths = tile_lengths(math.prod(shape), reference.tile_size)
        order = [int(i) for i in rng.permutation(len(lengths))]
        picked = []
        for count in sorted((c for _, c in reference.tiles.get(name, ())), reverse=True):
            i = next(i for i in order if lengths[i] >= count)
            order.remove(i)
            picked.append((i, count))
        tiles[name] = picked
    return TileMask(tile_size=reference.tile_size, shapes=dict(reference.shapes), tiles=tiles,
                    fraction=reference.fraction,
                    method=f"random matched to {reference.method}, seed={seed}")


def layer_mask(shapes: Mapping[str, Sequence[int]], fraction: float = 0.1, *,
               tile_size: int = DEFAULT_TILE_SIZE, reverse: bool = False) -> TileMask:
    """Whole tensors in model order (or reversed), the last one truncated to the exact budget."""
    names = list(shapes)[::-1] if reverse else list(shapes)
    rank = {n: len(names) - k for k, n in enumerate(names)}
    scores = {n: np.full(len(tile_lengths(math.prod(s), tile_size)), float(rank[n]))
              for n, s in shapes.items()}
    return mask_from_scores(scores, shapes, fraction, tile_size=tile_size,
                            method="whole layers" + (" (last first)" if reverse else ""))
