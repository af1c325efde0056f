"""``WritebackConfig``: the ``--writeback.*`` options, and ``build(model, optimizer)``.

The trainer maps ``--writeback.policy rne --writeback.format e4m3 --writeback.mask FILE`` onto a
:class:`WritebackConfig` and calls ``cfg.build(model, optimizer)`` (or :func:`build`) to get a
:class:`~snip.optim.writeback.WritebackOptimizer`.  Eligible parameters are, by default, the 2-D
weights of ``nn.Linear`` modules, except a weight tied to an ``nn.Embedding`` (1-D parameters,
norms, biases and embeddings stay fp32); ``include``/``exclude`` regexes on parameter names
narrow or widen that set (``include`` replaces the default rule).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from snip.errors import UserError
from snip.optim.grid import StorageGrid
from snip.optim.mask import DEFAULT_TILE_SIZE, TileMask
from snip.optim.policies import Policy, as_policy
from snip.optim.writeback import StateFormat, WritebackOptimizer


def _linear_weights(model: nn.Module) -> set[int]:
    tied = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    return {id(m.weight) for m in model.modules()
            if isinstance(m, nn.Linear) and m.weight.dim() == 2 and id(m.weight) not in tied}


def eligible_parameters(model: nn.Module, include: str | None = None,
                        exclude: str | None = None) -> list[tuple[str, nn.Parameter]]:
    """``(name, parameter)`` pairs stored on the low-precision grid, in ``named_parameters`` order.

    Default: 2-D ``nn.Linear`` weights not tied to an embedding.  ``include``: a regex on the
    parameter name that replaces the default rule (any 2-D or larger float parameter matching
    it).  ``exclude``: a regex removing names from the result.
    """
    linear = _linear_weights(model)
    out = []
    for name, p in model.named_parameters():
        ok = (re.search(include, name) is not None and p.dim() >= 2) if include else id(p) in linear
        if ok and not (exclude and re.search(exclude, name)):
            out.append((name, p))
    if not out:
        raise UserError(f"no eligible parameters in {type(model).__name__} (include={include!r}, "
                        f"exclude={exclude!r}); widen include or narrow exclude")
    return out


@dataclass(frozen=True, kw_only=True)
class WritebackConfig:
    """Settings of the write-back wrapper (the trainer's ``--writeback.*`` flags)."""

    policy: str = "rne"
    format: str = "e4m3"
    mask: str | None = None
    tile_size: int = DEFAULT_TILE_SIZE
    state_format: str | None = None
    seed: int = 0
    include: str | None = None
    exclude: str | None = None
    record_every: int = 1
    record_tiles: bool = False
    eco_rounding: str = "stochastic"

    def __post_init__(self) -> None:
        """Check the settings; an error starts with the field it names, so that
        ``snip.train.config.WritebackSection``, which re-uses these rules, prefixes its section
        (``writeback.format: ...``)."""
        pol = as_policy(self.policy)
        try:
            StorageGrid.parse(self.format)
        except ValueError as e:
            raise UserError(f"format: {e}") from None
        if self.state_format:
            try:
                StateFormat(name=self.state_format)
            except ValueError as e:
                raise UserError(f"state_format: {e}") from None
        if isinstance(self.tile_size, bool) or not isinstance(self.tile_size, int):
            raise UserError(f"tile_size must be an int, got {self.tile_size!r}")
        if self.tile_size < 1:
            raise UserError(f"tile_size must be > 0, got {self.tile_size!r}")
        if pol is Policy.SELECTIVE_MASTER and self.mask is None:
            raise UserError("mask is required by policy 'selective_master' (a tile mask "
                            "file, built with `snip audit --mask-out FILE`)")
        if self.mask is not None and pol is not Policy.SELECTIVE_MASTER:
            raise UserError(f"mask only applies to policy 'selective_master', not "
                            f"{self.policy!r}")
        if self.eco_rounding not in ("stochastic", "rne"):
            raise UserError(f"eco_rounding must be stochastic or rne, got "
                            f"{self.eco_rounding!r}")
        if self.record_every < 0:
            raise UserError(f"record_every must be >= 0, got {self.record_every}")
        for rx in (self.include, self.exclude):
            if rx:
                try:
                    re.compile(rx)
                except re.error as e:
                    raise UserError(f"bad parameter-name regex {rx!r}: {e}") from None

    def build(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> WritebackOptimizer:
        return build(model, optimizer, self)


def build(model: nn.Module, optimizer: torch.optim.Optimizer,
          config: WritebackConfig) -> WritebackOptimizer:
    """Wrap ``optimizer`` for ``model`` according to ``config`` (loads and checks the mask)."""
    params = eligible_parameters(model, config.include, config.exclude)
    mask = TileMask.load(Path(config.mask)) if config.mask else None
    if mask is not None and mask.tile_size != config.tile_size:
        raise UserError(f"mask {config.mask!r} uses tile_size {mask.tile_size}, config says "
                        f"{config.tile_size}; set tile_size to {mask.tile_size}")
    return WritebackOptimizer(optimizer, params, element=config.format, policy=config.policy,
                              mask=mask, seed=config.seed, state_format=config.state_format,
                              tile_size=config.tile_size, record_every=config.record_every,
                              record_tiles=config.record_tiles,
                              eco_rounding=config.eco_rounding)
