"""Run configuration: nested frozen dataclasses, TOML files and dotted command-line overrides.

A run is described by one `Config`, a tree of small frozen sections::

    Config(model=ModelSection, data=DataSection, train=TrainSection,
           precision=PrecisionSection, run=RunSection, log=LogSection,
           writeback=WritebackSection, dist=DistSection, seed=int)

Every leaf has a dotted key (``train.steps``, ``precision.preset``; the one top-level leaf is
``seed``) and a help string in its field metadata. The same keys are used three ways, so they
can never drift apart:

* a TOML file (``--config FILE``): ``[train]`` then ``steps = 2000``;
* command-line flags generated from the fields (``--train.steps 2000``), which win over the file;
* the fully resolved ``runs/NAME/config.toml`` written at the start of every run, which
  ``--resume`` reads back.

A misspelt key in either place is an error that names the closest valid key. Each section
validates itself in ``__post_init__`` and raises `snip.UserError` naming the dotted key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import enum
import functools
import math
import os
import re
import time
import tomllib
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from snip import atomic
from snip.errors import MissingFileError, UserError
from snip.jsonfile import flatten
from snip.nn.specs import Accum, GemmImpl
from snip.optim import Policy, WritebackConfig
from snip.train.distributed import MixedPrecision, Strategy
from snip.train.schedule import Shape

# The fixed plan used when no planner is installed (and the starting plan of adaptive runs).
DEFAULT_PRESET = "fp8_e4m3_tile128"
HISTORY = "history"  # the config.toml array of settings changed by --resume
# What --resume may change: none of these alters the numbers of the steps already defined
# (train.steps re-anchors the learning-rate schedule so that it stays continuous). Anything
# else makes a different run: branch it with --init-from.
RESUMABLE = ("train.steps", "train.eval_every", "train.eval_batches", "train.ckpt_every",
             "train.keep_checkpoints", "train.threads", "train.device", "train.skip_nonfinite",
             "train.force",
             "log.every", "log.progress", "log.tensorboard", "dist.timeout", "dist.strategy",
             "dist.cpu_offload")
FLOAT32_MAX = 3.4028234663852886e38
DEVICE_PATTERN = r"auto|cpu|mps|cuda(:\d+)?"
SEED_LIMIT = 2**32  # numpy's seeds are 32-bit
INT_LIMIT = 2**63  # every integer option is an int64 somewhere (torch, numpy, the schedule)
MAX_THREADS = 1024  # beyond this, starting the thread pool fails (or crashes) before any step
RUN_KEYS = ("run.dir", "run.name")  # where a run lives: its directory, not a setting
NAME_MAX = 255  # bytes in one path component (ext4, xfs, btrfs, tmpfs)


def opt(default: Any, help: str, **kw: Any) -> Any:
    """A config field with its help text (shown by ``snip train --help``)."""
    if callable(default):
        return field(default_factory=default, metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


def _methods() -> tuple[str, ...]:
    from snip.planner.baselines import Method  # on demand: the planner imports scipy

    return tuple(m.value for m in Method)


def _terms() -> tuple[str, ...]:
    from snip.sensitivity.table import Terms

    return tuple(t.value for t in Terms)


class PrecisionMode(enum.Enum):
    """``precision.mode``: one plan for the whole run, or SNIP re-planning during it."""

    FIXED = "fixed"
    ADAPTIVE = "adaptive"


# ``writeback.policy``: "none" (plain fp32 weights, nothing wrapped) or a snip.optim.Policy.
WritebackPolicy = enum.Enum("WritebackPolicy",
                            {"NONE": "none", **{p.name: p.value for p in Policy}})
WRITEBACK_POLICIES = tuple(p.value for p in WritebackPolicy)
NAMES = tuple[str, ...]  # a list option: a TOML array, or NAME NAME / NAME,NAME on the command line


def split_names(items: Sequence[str]) -> tuple[str, ...]:
    """A list option's names from ``["a", "b"]``, ``["a,b"]`` or a mix (the command line's
    ``NAME NAME`` or ``NAME,NAME``, every command alike); blanks dropped."""
    return tuple(n.strip() for v in items for n in v.split(",") if n.strip())


def _positive(key: str, value: float) -> None:
    if isinstance(value, bool) or not value > 0:
        raise UserError(f"{key} must be > 0, got {value!r}")


def _non_negative(key: str, value: float) -> None:
    if isinstance(value, bool) or not value >= 0:
        raise UserError(f"{key} must be >= 0, got {value!r}")


def _is_enum(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, enum.Enum)


@functools.cache
def _typed_fields(cls: type) -> tuple[tuple[str, Any], ...]:
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls)
                 if _is_enum(hints[f.name]) or hints[f.name] == NAMES)


def _typed(section: Any, prefix: str) -> None:
    """Turn a section's enum and list fields given as strings (``PrecisionSection(mode=
    "fixed")``, as library callers may) into their types, with the config's one message."""
    for name, tp in _typed_fields(type(section)):
        object.__setattr__(section, name, coerce(f"{prefix}.{name}", getattr(section, name), tp))


def _choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UserError(f"{key} must be one of {', '.join(choices)}; got {value!r}")


@dataclass(frozen=True, kw_only=True)
class ModelSection:
    name: str = opt("small", "model size from snip.models (tiny, tiny-deep, small, small-deep, "
                             "medium, tinyllama-1.1b, ...), or hf:DIR, the shape of a Hugging Face "
                             "model directory; the fields below replace its shape")
    dim: int = opt(0, "model width (0: model.name's)")
    n_layers: int = opt(0, "transformer blocks (0: model.name's)")
    n_heads: int = opt(0, "attention heads (0: model.name's)")
    n_kv_heads: int = opt(0, "key/value heads, grouped-query attention (0: model.name's)")
    ffn_dim: int = opt(0, "SwiGLU hidden width (0: model.name's)")

    SHAPE = {"dim": "dim", "n_layers": "n_layers", "n_heads": "n_heads",
             "n_kv_heads": "n_kv_heads", "ffn_dim": "ffn_hidden"}  # key -> ModelConfig field

    def __post_init__(self) -> None:
        from snip.models.configs import get_config, list_configs

        # hf:DIR: the shape of a Hugging Face model directory (its config.json), read below
        if not self.name.startswith("hf:") and self.name not in list_configs():
            close = difflib.get_close_matches(self.name, list_configs(), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise UserError(f"model.name: unknown model {self.name!r}{hint} "
                            f"(valid: {', '.join(list_configs())})")
        for key in self.SHAPE:
            _non_negative(f"model.{key}", getattr(self, key))
        try:
            get_config(self.name, **self.shape())
        except UserError as e:
            raise UserError(f"model: {e}") from None

    def shape(self) -> dict[str, int]:
        """The ModelConfig fields this section replaces in model.name's shape."""
        return {f: getattr(self, k) for k, f in self.SHAPE.items() if getattr(self, k)}


@dataclass(frozen=True, kw_only=True)
class DataSection:
    path: str = opt("", "text file, directory of text files, or .bin token file; empty: the "
                        "embedded corpus (Python standard-library sources)")
    tokenizer: str = opt("byte", "'byte' (256 symbols) or a tokenizer.json file (byte-level "
                                 "BPE with an end-of-text token, e.g. <|endoftext|>; README: "
                                 "Tokenizers)")
    val_fraction: float = opt(0.05, "share of the corpus held out for validation")
    order_seed: int = opt(-1, "seed of the training batch order (-1: the run's seed); a branch "
                              "(--init-from) with another order_seed sees other batches")
    allow_binary: bool = opt(False, "accept a text corpus that looks binary (NUL bytes or mostly "
                                    "invalid UTF-8); by default such a file is refused")
    vocab_size: int = opt(0, ".bin token files: the vocabulary size (0: the tokenizer's); every "
                             "token id must be below it")

    def __post_init__(self) -> None:
        if not 0 < self.val_fraction < 1:
            raise UserError(f"data.val_fraction must be in (0, 1), got {self.val_fraction!r}")
        _non_negative("data.vocab_size", self.vocab_size)
        if isinstance(self.order_seed, bool) or self.order_seed < -1:
            raise UserError(f"data.order_seed must be >= 0 (or -1: the run's seed), got "
                            f"{self.order_seed!r}")


@dataclass(frozen=True, kw_only=True)
class TrainSection:
    steps: int = opt(250, "optimizer steps")
    batch_size: int = opt(8, "sequences per optimizer step, summed over ranks and micro-steps")
    seq_len: int = opt(128, "tokens per sequence")
    grad_accum: int = opt(1, "micro-steps per optimizer step (gradient accumulation)")
    lr: float = opt(3e-3, "peak learning rate")
    schedule: Shape = opt(Shape.COSINE, "learning-rate decay after the warm-up: cosine, "
                                        "linear, constant or wsd (stable, then linear decay "
                                        "over the last 20%)")
    min_lr_ratio: float = opt(0.1, "final learning rate as a fraction of lr (decay floor)")
    warmup_steps: int = opt(20, "linear warm-up steps")
    weight_decay: float = opt(0.1, "AdamW decoupled decay on matrices (not norms, embeddings, "
                                   "biases)")
    beta1: float = opt(0.9, "AdamW beta1")
    beta2: float = opt(0.95, "AdamW beta2")
    grad_clip: float = opt(1.0, "clip the global gradient norm to this (0: off)")
    bf16: bool = opt(False, "bf16 autocast for the forward pass")
    eval_every: int = opt(50, "validate every N steps (and at the end)")
    eval_batches: int = opt(8, "validation batches per evaluation, spread evenly over the whole "
                               "validation split")
    ckpt_every: int = opt(100, "checkpoint every N steps (and at the end)")
    keep_checkpoints: int = opt(2, "keep the last K checkpoints")
    skip_nonfinite: bool = opt(False, "skip (and count) a step with a non-finite loss or "
                                      "gradient instead of stopping")
    max_skips: int = opt(10, "with train.skip_nonfinite: stop (keeping the last good "
                             "checkpoint) when more than this many steps were skipped")
    device: str = opt("auto", "'auto' (cuda if available), 'cpu', 'mps', 'cuda' or 'cuda:N'")
    threads: int = opt(0, "torch CPU threads (0: auto, half the cores: on a shared machine "
                          "oversubscribed threads slow small models down several times)")
    force: bool = opt(False, "start even when the memory estimate (weights, optimizer, "
                             "activations, emulation) exceeds the memory free on the device")

    def __post_init__(self) -> None:
        _typed(self, "train")
        for name in ("steps", "batch_size", "seq_len", "grad_accum", "eval_every",
                     "eval_batches", "ckpt_every", "keep_checkpoints", "lr"):
            _positive(f"train.{name}", getattr(self, name))
        for name in ("warmup_steps", "weight_decay", "grad_clip", "threads", "min_lr_ratio",
                     "max_skips"):
            _non_negative(f"train.{name}", getattr(self, name))
        if self.threads > MAX_THREADS:
            raise UserError(f"train.threads must be <= {MAX_THREADS}, got {self.threads} (0: "
                            "half the cores)")
        if self.min_lr_ratio > 1:
            raise UserError(f"train.min_lr_ratio must be <= 1, got {self.min_lr_ratio}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise UserError(f"train.{name} must be in [0, 1), got {getattr(self, name)}")
        if self.batch_size % self.grad_accum:
            raise UserError(f"train.batch_size={self.batch_size} must be divisible by "
                            f"train.grad_accum={self.grad_accum}")
        if not re.fullmatch(DEVICE_PATTERN, self.device):
            raise UserError(f"train.device must be auto, cpu, mps, cuda or cuda:N; "
                            f"got {self.device!r}")


@dataclass(frozen=True, kw_only=True)
class PrecisionSection:
    mode: PrecisionMode = opt(PrecisionMode.ADAPTIVE, "'fixed' (one plan for the whole run) or "
                              "'adaptive' (SNIP: warm up in precision.preset, then re-plan "
                              "every precision.every steps)")
    preset: str = opt("", f"apply this preset to every GEMM (empty: {DEFAULT_PRESET} unless "
                          "precision.plan is given)")
    plan: str = opt("", "precision plan JSON file (per layer, per GEMM)")
    budget: float = opt(0.75, "adaptive: target FP4-FLOP fraction for the planner")
    every: int = opt(100, "adaptive: re-plan every N steps")
    warmup: int = opt(-1, "adaptive: steps before the first plan, counted from the start of the "
                          "run or branch (-1: precision.every for a fresh run, 0 for a branch "
                          "made with --init-from)")
    method: str = opt("ilp", "adaptive: how the plan is chosen: ilp (SNIP) or a baseline at the "
                             "same budget (uniform, layer_id, layer_type, layer_id_rev, "
                             "layer_type_rev, min_rel_err, random, random_top, oracle)",
                      choices=_methods)
    per_gemm: bool = opt(False, "adaptive: choose the format of each GEMM (fprop, dgrad, wgrad) "
                                "separately instead of one per layer")
    candidates: NAMES = opt((), "adaptive: the candidate presets, high precision first (a "
                                "TOML list; flags take NAME NAME or NAME,NAME; empty: "
                                "fp8_e4m3_tile128,fp4_e2m1_tile128)")
    calib_batches: int = opt(1, "adaptive: calibration batches per statistics cycle (fresh "
                                "ones every cycle)")
    calib_rows: int = opt(2, "adaptive: sequences used from each calibration batch (0: all)")
    ema_decay: float = opt(0.5, "adaptive: weight of the past tables in the running average "
                                "the planner solves on (0: the newest table alone)")
    terms: str = opt("both", "adaptive: the planner's objective: both divergences (in nats), "
                             "or only 'loss' or 'weight' (ablations)",
                     choices=_terms)
    plan_seed: int = opt(0, "adaptive: seed of the random baseline's plan (one fixed plan per "
                            "seed, the same at every re-plan)")
    keep_top: int = opt(1, "adaptive, method random_top: SNIP's most sensitive units kept high")
    normalization: str = opt("nats", "adaptive: the objective's scale: nats (one common scale, "
                                     "the default) or sum (the paper's 1:1 of separately "
                                     "normalised loss and weight terms) or relative")
    gemm: GemmImpl = opt(GemmImpl.EMULATED, "how the FP8 GEMMs run: emulated (fp32 GEMM on the "
                                            "dequantized operands, any device) or native "
                                            "(torch._scaled_mm on the FP8 codes; emulated with "
                                            "one warning where unsupported); kept across "
                                            "re-plans")
    accum: Accum = opt(Accum.FP32, "the emulated GEMMs' arithmetic: fp32 (exact products, the "
                                   "same bits on every CPU), bf16 (bf16 operands, fp32 "
                                   "accumulation, bf16 output, as FP8/FP4 hardware writes) or "
                                   "auto (bf16 where the machine multiplies bf16 natively: AMX, "
                                   "AVX512-BF16, CUDA; else fp32); kept across re-plans")

    def __post_init__(self) -> None:
        _typed(self, "precision")
        if self.preset and self.plan:
            raise UserError("give either precision.preset or precision.plan, not both")
        if self.preset:
            from snip.formats import get_spec

            try:
                get_spec(self.preset)
            except (KeyError, ValueError) as e:
                raise UserError(f"precision.preset: {e}") from None
        if not 0 <= self.budget <= 1:
            raise UserError(f"precision.budget must be in [0, 1], got {self.budget}")
        _positive("precision.every", self.every)
        _positive("precision.calib_batches", self.calib_batches)
        _non_negative("precision.calib_rows", self.calib_rows)
        if not 0 <= self.ema_decay < 1:
            raise UserError(f"precision.ema_decay must be in [0, 1), got {self.ema_decay!r}")
        _choice("precision.terms", self.terms, ("both", "loss", "weight"))
        _non_negative("precision.plan_seed", self.plan_seed)
        _non_negative("precision.keep_top", self.keep_top)
        _choice("precision.normalization", self.normalization, ("nats", "sum", "relative"))
        if isinstance(self.warmup, bool) or self.warmup < -1:
            raise UserError(f"precision.warmup must be >= 0 (or -1: automatic), got "
                             f"{self.warmup!r}")
        if self.method != "ilp":  # the default needs no import of the planner (scipy)
            from snip.planner.baselines import Method

            try:
                Method.parse(self.method)
            except ValueError as e:
                raise UserError(f"precision.method: {e}") from None
        if self.candidates:
            from snip.formats import get_spec

            for name in self.candidates:
                try:
                    get_spec(name)
                except (KeyError, ValueError) as e:
                    raise UserError(f"precision.candidates: {e}") from None


@dataclass(frozen=True, kw_only=True)
class RunSection:
    name: str = opt("", "run name; the run directory is run.dir/run.name (empty: "
                        "MODEL-YYYYmmdd-HHMMSS)")
    dir: str = opt("runs", "parent directory of run directories")

    def __post_init__(self) -> None:
        if "/" in self.name or self.name in (".", ".."):
            raise UserError(f"run.name must be a plain name, got {self.name!r} "
                            "(use run.dir for the parent directory)")
        if len(self.name.encode()) > NAME_MAX:
            raise UserError(f"run.name is {len(self.name.encode())} bytes long; file systems "
                            f"allow at most {NAME_MAX}: choose a shorter --run.name")
        # Checked before anything is created: an existing file on the path is a user error.
        for part in (Path(self.dir), *Path(self.dir).parents):
            if part.exists():
                if not part.is_dir():
                    raise UserError(f"run.dir: {str(part)!r} is a file, not a directory; "
                                    "choose another --run.dir")
                break
        if self.name and (Path(self.dir) / self.name).exists() \
                and not (Path(self.dir) / self.name).is_dir():
            raise UserError(f"run.name: {str(Path(self.dir) / self.name)!r} is a file, not a "
                            "run directory; choose another --run.name")
        where = Path(self.dir) / self.name
        if self.name and where.is_symlink() and not where.exists():
            raise UserError(f"run.name: {str(where)!r} is a symlink to nothing "
                            f"({os.readlink(where)!r}); remove it or choose another --run.name")


@dataclass(frozen=True, kw_only=True)
class DistSection:
    """Multi-process training (``torchrun``); a world of one ignores all but the checks."""

    strategy: Strategy = opt(Strategy.DDP, "data parallelism when launched with torchrun: "
                                           "'ddp' (DistributedDataParallel: a full replica per "
                                           "rank) or 'fsdp' (FSDP2 fully_shard per transformer "
                                           "block: parameters, gradients and optimizer state "
                                           "sharded; sharded checkpoints)")
    mixed_precision: MixedPrecision = opt(MixedPrecision.NONE, "fsdp: compute dtype of the "
                                                               "gathered parameters, 'none' (as "
                                                               "stored) or 'bf16' (gradients "
                                                               "reduced in fp32)")
    cpu_offload: bool = opt(False, "fsdp: keep parameter shards, gradients and optimizer state "
                                   "in CPU memory (CUDA runs; slower, less GPU memory)")
    timeout: float = opt(300.0, "seconds a rank waits in a collective (gradient all-reduce, "
                                "barrier) before the run stops with an error: a hung or "
                                "killed peer cannot block the others forever; must exceed the "
                                "time rank 0 needs to save a checkpoint")

    def __post_init__(self) -> None:
        _typed(self, "dist")
        _positive("dist.timeout", self.timeout)


@dataclass(frozen=True, kw_only=True)
class LogSection:
    every: int = opt(10, "log training loss, lr and tokens/s every N steps")
    progress: bool = opt(True, "show a progress bar (tqdm)")
    tensorboard: bool = opt(False, "also write TensorBoard events (needs tensorboard)")

    def __post_init__(self) -> None:
        _positive("log.every", self.every)


@dataclass(frozen=True, kw_only=True)
class WritebackSection:
    """Safe weight write-back (snip.optim): store the 2-D linear weights on a low-precision grid.

    Mirrors ``snip.optim.WritebackConfig``; the stochastic-rounding generator is seeded from
    ``seed``. Empty strings mean "not set" (TOML has no null)."""

    policy: WritebackPolicy = opt(WritebackPolicy.NONE,
                                  "weight write-back after each optimizer step: 'none' (plain "
                                  "fp32 weights), or store the 2-D linear weights on the "
                                  "writeback.format grid with 'rne', 'stochastic' (unbiased "
                                  "rounding), 'master' (fp32 master copy), 'selective_master' "
                                  "(fp32 masters on the tiles of writeback.mask) or 'eco' (error "
                                  "feedback into Adam's momentum)")
    format: str = opt("e4m3", "storage grid of the managed weights: an element (e4m3, e5m2, "
                              "e2m1, bf16, any eXmY; scale 1) or a preset such as fp8_e4m3 "
                              "(block-scaled)")
    mask: str = opt("", "tile mask JSON file (from `snip audit --mask-out FILE`); required by "
                        "and only used with policy 'selective_master'")
    tile_size: int = opt(768, "coordinates per tile of the flattened weights; must equal the "
                              "mask's tile_size")
    eco_rounding: str = opt("stochastic", "policy 'eco': rounding inside its quantizer, "
                                          "'stochastic' (the ECO paper's setting) or 'rne'")
    state_format: str = opt("", "round the managed weights' AdamW moments after each step to "
                                "this element (bf16, fp16) or preset (e.g. mxfp8_e4m3); empty: "
                                "fp32 states")

    def __post_init__(self) -> None:
        _typed(self, "writeback")
        if self.policy is WritebackPolicy.NONE:
            # Nothing is wrapped; reject the settings that would be silently ignored.
            if self.state_format:
                raise UserError("writeback.state_format needs a writeback.policy other than "
                                f"'none' (valid: {', '.join(WRITEBACK_POLICIES[1:])})")
            if self.mask:
                raise UserError("writeback.mask only applies to writeback.policy "
                                "'selective_master', not 'none'")
        # The rules live in snip.optim.WritebackConfig; its errors start with the field's name.
        try:
            self.to_config()
        except UserError as e:
            raise UserError(f"writeback.{e}") from None

    def to_config(self, **extra: Any) -> WritebackConfig:
        """The library config of this section ("" means unset). Policy 'none' wraps nothing, so
        it maps to 'rne' here only to check its (unused) format and tile_size."""
        on = self.policy is not WritebackPolicy.NONE
        return WritebackConfig(policy=Policy(self.policy.value) if on else Policy.RNE,
                               format=self.format,
                               mask=(self.mask or None) if on else None, tile_size=self.tile_size,
                               state_format=(self.state_format or None) if on else None,
                               eco_rounding=self.eco_rounding, **extra)


@dataclass(frozen=True, kw_only=True)
class Config:
    model: ModelSection = opt(ModelSection, "model")
    data: DataSection = opt(DataSection, "data")
    train: TrainSection = opt(TrainSection, "training")
    precision: PrecisionSection = opt(PrecisionSection, "precision")
    run: RunSection = opt(RunSection, "run directory")
    log: LogSection = opt(LogSection, "logging")
    writeback: WritebackSection = opt(WritebackSection, "write-back")
    dist: DistSection = opt(DistSection, "distributed (torchrun)")
    seed: int = opt(1337, "seed of every random number generator")

    def __post_init__(self) -> None:
        if not 0 <= self.seed < SEED_LIMIT:
            raise UserError(f"seed must be in [0, 2**32), got {self.seed}")


# ---------------------------------------------------------------------------------------------
# The dotted-key view of the tree.


@dataclass(frozen=True)
class Leaf:
    """One option: its dotted key, Python type, default, help text and, for an enumerated
    value, its choices (`choices`; computed on demand)."""

    key: str
    type: type
    default: Any
    help: str
    raw_choices: Any = ()

    @property
    def choices(self) -> tuple[str, ...]:
        if _is_enum(self.type):
            return tuple(m.value for m in self.type)
        c = self.raw_choices
        return tuple(c() if callable(c) else c)


def _is_section(tp: Any) -> bool:
    return dataclasses.is_dataclass(tp)


def leaves(cls: type = Config, prefix: str = "") -> Iterator[Leaf]:
    """Every option of the tree in declaration order (defaults as a fresh Config has them)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if _is_section(tp):
            yield from leaves(tp, f"{prefix}{f.name}.")
            continue
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        yield Leaf(f"{prefix}{f.name}", tp, default, f.metadata.get("help", ""),
                   f.metadata.get("choices", ()))


def leaf_map() -> dict[str, Leaf]:
    return {leaf.key: leaf for leaf in leaves()}


def unknown_key_error(key: str, where: str) -> UserError:
    """UserError for a misspelt key, naming the closest valid one."""
    valid = list(leaf_map())
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return UserError(f"unknown {where} {key!r}{hint}")


def coerce(key: str, value: Any, tp: Any) -> Any:
    """Convert a TOML or command-line value to the field's type, or raise naming the key."""
    if _is_enum(tp):
        if isinstance(value, tp):
            return value
        with contextlib.suppress(ValueError, TypeError):
            return tp(value)
        raise UserError(f"{key} must be one of {', '.join(m.value for m in tp)}; got {value!r}")
    if tp == NAMES:
        items = [value] if isinstance(value, str) else value
        if isinstance(items, list | tuple) and all(isinstance(v, str) for v in items):
            return split_names(items)
        raise UserError(f"{key} expects a list of names (or NAME,NAME), got {value!r}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
            return False
    elif tp is int and not isinstance(value, bool):
        number = value if isinstance(value, int) else None
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                number = int(value)
        if number is not None:
            if not -INT_LIMIT <= number < INT_LIMIT:
                raise UserError(f"{key} must fit in a 64-bit integer (|x| < 2**63), got "
                                f"{value!r}")
            return number
    elif tp is float and not isinstance(value, bool):
        number = None
        if isinstance(value, int | float):
            number = float(value)
        elif isinstance(value, str):
            with contextlib.suppress(ValueError):
                number = float(value)
        if number is not None:
            # The model computes in float32: a larger value overflows to inf inside the run.
            if not (math.isfinite(number) and abs(number) <= FLOAT32_MAX):
                raise UserError(f"{key} must be a finite number within float32 range "
                                f"(|x| <= {FLOAT32_MAX:.4g}), got {value!r}")
            return number
    elif tp is str and isinstance(value, str):
        return value
    raise UserError(f"{key} expects {tp.__name__}, got {value!r}")


# ---------------------------------------------------------------------------------------------
# Building a Config from flat overrides and TOML, and writing it back.


def build(values: Mapping[str, Any], base: Config | None = None) -> Config:
    """A Config from dotted ``values`` on top of ``base`` (the defaults when None).

    Unknown keys raise with a suggestion; values are coerced to the field types; sections are
    validated by their own ``__post_init__``."""
    known = leaf_map()
    for key in values:
        if key not in known:
            raise unknown_key_error(key, "config key")
    base = base or Config()
    sections: dict[str, dict[str, Any]] = {}
    top: dict[str, Any] = {}
    for key, value in values.items():
        value = coerce(key, value, known[key].type)
        if "." in key:
            section, name = key.split(".", 1)
            sections.setdefault(section, {})[name] = value
        else:
            top[key] = value
    for section, changes in sections.items():
        top[section] = dataclasses.replace(getattr(base, section), **changes)
    return dataclasses.replace(base, **top)


def _parse(text: str, where: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"config file {where!r} is not valid TOML: {e}") from None


def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise MissingFileError(f"config file {str(path)!r} not found")
    return _parse(path.read_text(), str(path))


def read_toml_text(text: str) -> dict[str, Any]:
    """`read_toml` of a config held in a string (a checkpoint's config.toml)."""
    tree = _parse(text, "<checkpoint config.toml>")
    tree.pop(HISTORY, None)
    return flatten(tree)


def read_history_text(text: str) -> list[dict[str, Any]]:
    """The ``[[history]]`` entries of a config held in a string (a checkpoint's config.toml):
    ``{"step": N, key: [old, new]}`` for each setting ``--resume`` changed."""
    return list(_parse(text, "<checkpoint config.toml>").get(HISTORY, []))


def read_toml(path: str | Path) -> dict[str, Any]:
    """A TOML config file as dotted keys (unknown keys are caught later by `build`); the
    ``[[history]]`` of a run's config.toml is read by `read_history_text`."""
    tree = _read(Path(path))
    tree.pop(HISTORY, None)
    return flatten(tree)


def resolve(config: Config, explicit: set[str] = frozenset()) -> Config:
    """Fill in what depends on other values: the precision mode and starting preset, and the
    run name. ``explicit`` is the set of keys the user set (file or command line)."""
    p = config.precision
    mode = p.mode
    if (p.preset or p.plan) and "precision.mode" not in explicit:
        mode = PrecisionMode.FIXED  # naming a preset or a plan file means "use exactly this"
    preset = p.preset or ("" if p.plan else DEFAULT_PRESET)
    precision = dataclasses.replace(p, mode=mode, preset=preset)
    run = config.run
    if not run.name:
        run = dataclasses.replace(run, name=f"{config.model.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    return dataclasses.replace(config, precision=precision, run=run)


def _toml_value(v: Any) -> str:
    v = plain(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
        return repr(v)
    s = str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{s}"'


def to_toml(config: Config, history: list[dict[str, Any]] | None = None) -> str:
    """The config as TOML, one table per section, each key with its help as a comment; then
    the ``[[history]]`` of settings changed by ``--resume`` (see `resume_changes`)."""
    lines = ["# snip run configuration (fully resolved)."]
    fields = dataclasses.fields(Config)
    for f in fields:  # top-level keys must precede the first [table]
        if not _is_section(getattr(config, f.name)):
            lines.append(f"{f.name} = {_toml_value(getattr(config, f.name))}")
    for f in fields:
        section = getattr(config, f.name)
        if not _is_section(section):
            continue
        lines += ["", f"[{f.name}]"]
        for sf in dataclasses.fields(section):
            lines.append(f"{sf.name} = {_toml_value(getattr(section, sf.name))}"
                         f"  # {sf.metadata.get('help', '')}")
    if history:
        lines += ["", "# Settings changed by --resume: from `step` on, key = [old, new]; the "
                  "tables above hold the values in force now."]
    for entry in history or []:
        lines += ["", f"[[{HISTORY}]]", f"step = {int(entry['step'])}"]
        for key, (old, new) in ((k, v) for k, v in entry.items() if k != "step"):
            lines.append(f'"{key}" = [{_toml_value(old)}, {_toml_value(new)}]')
    return "\n".join(lines) + "\n"


def to_dict(config: Config) -> dict[str, Any]:
    """The config as plain data (enums as their values, lists as lists): JSON-ready."""
    return plain(dataclasses.asdict(config))


def plain(v: Any) -> Any:
    """An option's value as plain data: an enum's value, a list for a tuple."""
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, list | tuple):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    return v


def write_toml(config: Config, path: str | Path,
               history: list[dict[str, Any]] | None = None) -> None:
    atomic.write_text(path, to_toml(config, history))


def load(path: str | Path) -> Config:
    """Read a config.toml (as written by `write_toml`) back into a Config."""
    return build(read_toml(path))


def run_dir_of(resume: str | Path) -> Path:
    """The run directory of ``--resume`` (a run directory or one of its checkpoints)."""
    path = Path(resume)
    return path.parent.parent if path.parent.name == "checkpoints" else path


def changes(old: Config, new: Config) -> dict[str, tuple[Any, Any]]:
    """``{key: (old, new)}`` for every dotted key whose value differs."""
    a, b = flatten(to_dict(old)), flatten(to_dict(new))
    return {k: (a[k], b[k]) for k in b if a.get(k) != b[k]}


def resume_changes(saved: Config, new: Config, checkpoint: Path) -> dict[str, tuple[Any, Any]]:
    """The changes ``--resume`` makes to a run, or an error when one would make another run."""
    # A run is identified by its directory, wherever it is now (moved, copied, reached through
    # a symlink or another spelling of the path): run.dir and run.name are not settings.
    diff = {k: v for k, v in changes(saved, new).items() if k not in RUN_KEYS}
    for key, (old, value) in diff.items():
        if key not in RESUMABLE:
            flag = f"--{key} {_toml_value(value)}"
            raise UserError(f"--resume cannot change {key} ({_toml_value(old)} -> "
                             f"{_toml_value(value)}): the run would no longer match its own "
                             f"history; branch a new run instead: snip train --init-from "
                             f"{checkpoint} --run.name NEW {flag}")
    return diff


def _precision_source(values: dict[str, Any], explicit: set[str]) -> None:
    # A preset or plan given now replaces the other one inherited from a saved config.
    if "precision.plan" in explicit and "precision.preset" not in explicit:
        values["precision.preset"] = ""
    if "precision.preset" in explicit and "precision.plan" not in explicit:
        values["precision.plan"] = ""


def _saved_config(checkpoint_dir: Path) -> dict[str, Any]:
    saved = checkpoint_dir / "config.toml"
    if not saved.is_file():
        raise MissingFileError(f"{checkpoint_dir} is not a snip checkpoint (no config.toml)")
    return read_toml(saved)


def from_sources(config_file: str | Path | None = None,
                 overrides: Mapping[str, Any] | None = None,
                 resume: str | Path | None = None,
                 init_from: str | Path | None = None) -> Config:
    """The resolved Config of a command line: defaults < TOML file < flags.

    ``resume``: the checkpoint's saved config replaces the defaults and the run keeps its own
    directory (the trainer refuses changes outside `RESUMABLE`). ``init_from``: a branch; the
    parent checkpoint's config replaces the defaults, and the new run gets its own name (given,
    or generated) in the parent's run.dir unless set. The model and tokenizer are checked
    against the checkpoint when it is loaded."""
    from snip.train.checkpoint import find

    if resume is not None and init_from is not None:
        raise UserError("give either --resume (continue a run) or --init-from (branch a new "
                         "run from a checkpoint), not both")
    values = read_toml(config_file) if config_file else {}
    values.update(overrides or {})
    explicit = set(values)
    if resume is None and init_from is None:
        return resolve(build(values), explicit=explicit)
    flag = "--resume" if resume is not None else "--init-from"
    given = [k for k in RUN_KEYS if k in explicit]
    if resume is not None and given:
        raise UserError(f"--resume continues the run in its own directory; drop --{given[0]} "
                        f"(to start a new run from that state: snip train --init-from "
                        f"{resume} --{given[0]} ...)")
    source = find(Path(resume if resume is not None else init_from), flag)
    base = _saved_config(source)
    if resume is not None:
        run_dir = Path(os.path.abspath(run_dir_of(source)))  # `--resume .` names the run too
        values = {**base, **values, "run.dir": str(run_dir.parent), "run.name": run_dir.name}
    else:
        values = {**base, "run.name": "", **values}
    _precision_source(values, explicit)
    # The saved mode stands unless a new preset or plan is named (which means "exactly this").
    keep_mode = resume is not None or not {"precision.preset", "precision.plan"} & explicit
    return resolve(build(values), explicit=explicit | ({"precision.mode"} if keep_mode else set()))
