"""Training: the loop, its configuration, checkpoints, logging and data parallelism.

    from snip.train import Config, from_sources, train
    result = train(from_sources(overrides={"model.name": "tiny", "train.steps": 50}))

`snip train` is a thin wrapper over `from_sources` + `train` + `snip.report.write_report`.
"""

from snip.train.checkpoint import CheckpointError
from snip.train.config import (
    DEFAULT_PRESET,
    Config,
    DataSection,
    LogSection,
    ModelSection,
    PrecisionSection,
    RunSection,
    TrainSection,
    WritebackSection,
    build,
    from_sources,
    leaves,
    to_toml,
)
from snip.train.loop import NonFiniteError, RunResult, train
from snip.train.precision import PrecisionController
from snip.train.runstate import make_optimizer

__all__ = [
    "DEFAULT_PRESET", "CheckpointError", "Config", "DataSection", "LogSection", "ModelSection",
    "NonFiniteError", "PrecisionController", "PrecisionSection", "RunResult", "RunSection",
    "TrainSection", "WritebackSection", "build", "from_sources",
    "leaves", "make_optimizer", "to_toml", "train",
]
