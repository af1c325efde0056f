"""``snip train --init-from-hf DIR``: continue pretraining a Hugging Face checkpoint with SNIP.

    snip train --init-from-hf hf/tinyllama --run.name tl_snip --precision.mode adaptive

The way the SNIP paper continues TinyLlama and OpenLlama checkpoints: the run's model is the
shape of ``DIR`` (model name ``hf:DIR``, read from its ``config.json``: `snip.models.hf`) and
before the first step :class:`HFWeights` copies ``DIR``'s weights (``model.safetensors``, or its
sharded index) into it; everything else -- optimizer, schedule, precision plan, controller,
checkpoints -- is a fresh snip run from step 0.  A later ``--resume`` rebuilds the ``hf:DIR``
shape and continues from the run's own checkpoint (``DIR`` must still exist for its shape).

What converts: ``LlamaForCausalLM`` and ``MistralForCausalLM`` without sliding window and with
the default RoPE (`snip.models.hf.config_from_hf` says what does not, e.g. Qwen2's attention
biases).  The data's tokenizer must give the model's vocabulary (a byte-level model: the byte
tokenizer; otherwise ``--data.tokenizer``).  Not yet with ``--dist.strategy fsdp`` or a weight
write-back policy (both take their state before the weights arrive).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from snip.errors import UserError
from snip.models.hf import HF_PREFIX, hf_dir_config, load_hf_dir
from snip.train.config import WritebackPolicy
from snip.train.distributed import Strategy
from snip.train.loop import Hook, Trainer


class HFWeights(Hook):
    """Copies the HF directory's weights into the model of a fresh run, before its directory is
    made (a directory whose weights do not load or fit leaves none behind)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.loaded = False

    def on_build(self, trainer: Trainer) -> None:
        if trainer.step_count != 0:  # resumed: the run's own checkpoint has the weights
            return
        cfg = trainer.model.config
        want = hf_dir_config(self.path).vocab_size
        if cfg.vocab_size != want:
            raise UserError(f"{self.path} has a vocabulary of {want} ids, the data's tokenizer "
                            f"gives {cfg.vocab_size}; pass the model's tokenizer "
                            "(--data.tokenizer FILE)")
        load_hf_dir(self.path, trainer.model)
        self.loaded = True

    def on_start(self, trainer: Trainer) -> None:
        if trainer.step_count != 0:
            return
        if not self.loaded:  # attached after the Trainer was built: load now
            self.on_build(trainer)
        trainer.log.log("init_from_hf", 0, path=str(self.path.resolve()))


def init_from_hf(path: str | Path, overrides: Mapping[str, Any]) -> tuple[dict[str, Any], Hook]:
    """The config overrides and the hook of ``snip train --init-from-hf path``."""
    path = Path(path)
    hf_dir_config(path)  # not an HF directory, or a model that does not convert: one line now
    values = dict(overrides)
    name = values.setdefault("model.name", HF_PREFIX + str(path.resolve()))
    if name != HF_PREFIX + str(path.resolve()):
        raise UserError(f"--init-from-hf sets the model (hf:{path}); drop --model.name {name}")
    if values.get("dist.strategy") in (Strategy.FSDP, Strategy.FSDP.value):
        raise UserError("--init-from-hf does not support --dist.strategy fsdp yet; use ddp")
    if values.get("writeback.policy", WritebackPolicy.NONE) not in (WritebackPolicy.NONE,
                                                                     WritebackPolicy.NONE.value):
        raise UserError("--init-from-hf does not support a weight write-back policy yet")
    return values, HFWeights(path)
