"""Safe weight write-back: low-precision weight storage and write-back policies.

Start with :class:`WritebackOptimizer` (wrap any torch optimizer) or :class:`WritebackConfig`
(``--writeback.*`` options, ``cfg.build(model, optimizer)``).  Policies: ``rne``, ``stochastic``,
``master``, ``selective_master`` (with a :class:`TileMask`), ``eco``.  The audit of what these
record lives in :mod:`snip.audit`.
"""

from snip.optim.config import WritebackConfig, build, eligible_parameters
from snip.optim.grid import StorageGrid
from snip.optim.mask import (
    DEFAULT_TILE_SIZE,
    TileMask,
    full_mask,
    num_tiles,
    tile_lengths,
    tile_means,
)
from snip.optim.policies import (
    ECOPolicy,
    MasterPolicy,
    Policy,
    RNEPolicy,
    SelectiveMasterPolicy,
    StochasticPolicy,
    WritebackPolicy,
    as_policy,
    make_policy,
)
from snip.optim.writeback import StateFormat, StepRecord, TensorRecord, WritebackOptimizer

__all__ = [
    "DEFAULT_TILE_SIZE", "ECOPolicy", "MasterPolicy", "Policy", "RNEPolicy",
    "SelectiveMasterPolicy",
    "StateFormat", "StepRecord", "StochasticPolicy", "StorageGrid", "TensorRecord", "TileMask",
    "WritebackConfig",
    "WritebackOptimizer", "WritebackPolicy", "as_policy", "build", "eligible_parameters",
    "full_mask", "make_policy", "num_tiles", "tile_lengths", "tile_means",
]
