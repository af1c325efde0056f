"""The one training core: a `Trainer` whose `step()` every command and experiment calls.

    Trainer(cfg)                         a fresh run in runs/NAME
    Trainer(cfg, resume=RUN_OR_CKPT)     continue that run exactly where it stopped
    Trainer(cfg, init_from=CKPT)         a new run (its own directory and settings) that starts
                                         from a checkpoint's weights, optimizer state and step
    train(cfg, ...)                      Trainer(...).run(), closed afterwards

`snip train`, `snip compare`, `snip audit` and the scripts in ``benchmarks/`` all train through
this class; what they need beyond training they attach as `Hook`s (record a reference trace
around the optimizer update, collect write-back records, watch evaluations or plan changes).

One optimizer step (`Trainer.step`), readable top to bottom:

1. the learning rate of this step (`snip.train.schedule`: warm-up, then cosine/linear/constant/
   wsd decay, continuous across resumes and branches that change the length);
2. the step's global batch (a pure function of the step and the data order seed) and this
   rank's rows of it, split into ``grad_accum`` micro-batches; forward (optionally under bf16
   autocast) and backward each, scaling the loss by 1/grad_accum so the gradients add up to the
   mean;
3. the gradients are averaged over ranks by DDP or FSDP2 in the last micro-batch's backward
   (`snip.train.distributed`); clip their global norm, and stop -- or skip the step with
   ``train.skip_nonfinite`` -- if the loss or the gradient is not finite;
4. AdamW step (decoupled weight decay on matrices only), through the weight write-back wrapper
   when ``writeback.policy`` is set (see `snip.train.writeback`).

`Trainer.run` adds the bookkeeping at each step boundary: log, validate (with the plan and in
high precision, `snip.train.evaluation`), let an adaptive precision controller re-plan (never
after the last step), checkpoint; Ctrl-C is noticed there and saves before exiting.

Numerics are seeded end to end: the model init, the data (per step) and every RNG stream that
quantization may draw from are restored from checkpoints, so a resumed run reproduces the loss
sequence of an uninterrupted one bit for bit (same device, same thread count), and so does a
branch made with the parent's own settings.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import statistics
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from snip.errors import UserError
from snip.formats.scaling import RowShard
from snip.models import ModelConfig, build_model, get_config
from snip.nn import bf16_gemms_idle, convert, qlinear_layers
from snip.plan import PrecisionPlan, fp4_flop_fraction
from snip.train import checkpoint, distributed, rundir, runstate
from snip.train import config as C
from snip.train import writeback as wb
from snip.train.batches import Batch, Batches, open_data
from snip.train.evaluation import EvalResult, autocast, evaluate
from snip.train.metrics import (
    COMPILE_NOTE,
    MetricsLog,
    Progress,
    check_tensorboard,
    kernels_compiled,
)
from snip.train.precision import explicit, initial_plan, make_controller
from snip.train.resume import (
    check_compatible,
    check_steps_left,
    prepare_run_dir,
    schedule_at,
    settings_history,
)
from snip.train.runstate import make_optimizer

CALIBRATION_KEY = 10**12  # data "step" of the controller's calibration batches


class NonFiniteError(RuntimeError):
    """The loss or gradient became NaN/inf; the last good state has been checkpointed."""


@dataclass(frozen=True)
class StepResult:
    """What one optimizer step did. ``step`` counts steps completed (1 after the first)."""

    step: int
    loss: float
    lr: float
    grad_norm: float
    skipped: bool
    seconds: float


@dataclass
class RunResult:
    run_dir: Path
    step: int
    train_loss: float = math.nan
    val_loss: float = math.nan
    val_loss_hp: float = math.nan
    interrupted: bool = False
    skipped_steps: int = 0
    seconds: float = 0.0
    losses: dict[int, float] = field(default_factory=dict)
    evals: list[EvalResult] = field(default_factory=list)


class Hook:
    """Callbacks into the trainer; subclass and override what you need (all default to no-op).

    ``before_update``/``after_update`` bracket the optimizer update of a finite step (the
    gradients are averaged and clipped), so a hook can see the weights before and after.
    ``on_build`` runs once the model, optimizer and any checkpoint's state are in place and
    before the run directory is touched: what can fail there (weights that do not fit) leaves
    the directory as it was."""

    def on_build(self, trainer: Trainer) -> None: ...

    def on_start(self, trainer: Trainer) -> None: ...

    def before_update(self, trainer: Trainer) -> None: ...

    def after_update(self, trainer: Trainer) -> None: ...

    def after_step(self, trainer: Trainer, result: StepResult) -> None: ...

    def on_eval(self, trainer: Trainer, result: EvalResult) -> None: ...

    def on_plan_change(self, trainer: Trainer, step: int, plan: PrecisionPlan) -> None: ...


# ---------------------------------------------------------------------------------------------
# Small pieces.


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"train.device={name!r} but CUDA is not available; use cpu or auto")
    if name == "mps" and not (torch.backends.mps.is_built() and torch.backends.mps.is_available()):
        raise UserError("train.device='mps' but this PyTorch build has no usable MPS device; "
                        "use cpu or auto")
    if name.startswith("cuda:") and int(name[5:]) >= torch.cuda.device_count():
        raise UserError(f"train.device={name!r} but only {torch.cuda.device_count()} CUDA "
                        "device(s) are visible")
    return torch.device(name)


def sync_quant_counters(model: nn.Module, step: int, tokens: RowShard | None = None) -> None:
    """Set every QLinear's forward counter (which seeds its stochastic rounding) from the step,
    and the place of this forward's tokens in the step's global batch (``None``: unplaced), so
    that the noise is a pure function of (step, token): exact resume, evaluation forwards never
    shift the training noise, and every split of a batch over ranks and micro-batches draws
    the coins of one process running the whole batch at once."""
    for _, m in qlinear_layers(model):
        m.step = step
        m.tokens = tokens


def _placed(first: int, rows: int, batch: int, seq_len: int) -> RowShard | None:
    """The tokens of batch rows ``first .. first + rows - 1`` as a shard of the global batch's;
    ``None`` when they are the whole batch (one process, no accumulation), which draws the same
    coins and leaves the layers' settings, and so their config handles, unchanged."""
    return None if rows == batch else RowShard(first * seq_len, batch * seq_len)


def local_rows(batch: Batch, dist: distributed.DistInfo) -> Batch:
    """This rank's contiguous share of the global batch."""
    x, y = batch
    n = x.shape[0] // dist.world_size
    return x[dist.rank * n:(dist.rank + 1) * n], y[dist.rank * n:(dist.rank + 1) * n]


def seed_step(seed: int, rank: int, step: int) -> None:
    """Reseed the global RNGs at the start of every step: whatever quantization or a controller
    draws is then a pure function of (seed, rank, step), so resuming needs no RNG history and
    every rank still gets its own stream."""
    torch.manual_seed((seed * 1_000_003 + step) * 1024 + rank)


def order_seed(cfg: C.Config) -> int:
    """The seed of the training batch order (``data.order_seed``, or the run's seed)."""
    return cfg.seed if cfg.data.order_seed < 0 else cfg.data.order_seed


class StopFlag:
    """Set by SIGINT (Ctrl-C) or SIGTERM (what torchrun and schedulers send): the loop saves a
    checkpoint at the end of the step and exits. A second signal interrupts at once -- unless
    it comes within ``grace`` seconds of the first: torchrun forwards the terminal's Ctrl-C to
    workers that already received it, and that echo must not cancel the save."""

    def __init__(self, grace: float = 2.0) -> None:
        self.set = False
        self.grace, self._first = grace, 0.0
        self._previous: Any = None

    def __enter__(self) -> StopFlag:
        with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
            self._previous = {s: signal.signal(s, self._handle)
                              for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.set and time.monotonic() - self._first > self.grace:
            raise KeyboardInterrupt
        if not self.set:
            self.set, self._first = True, time.monotonic()

    def __exit__(self, *exc: object) -> None:
        for s, previous in (self._previous or {}).items():
            signal.signal(s, previous)


def model_config(cfg: C.Config, data: Batches) -> ModelConfig:
    """The model of ``cfg`` sized for the data's vocabulary and the run's sequence length."""
    base = get_config(cfg.model.name)
    return get_config(cfg.model.name, vocab_size=data.vocab_size,
                      max_seq_len=max(cfg.train.seq_len, base.max_seq_len), **cfg.model.shape())


def run_dir_for(cfg: C.Config) -> Path:
    return Path(cfg.run.dir) / cfg.run.name


# ---------------------------------------------------------------------------------------------
# The trainer.


_bf16_noted = False  # whether this process printed Trainer._note_bf16_gemms's line


class Trainer:
    """Model, optimizer, schedule, data position, precision plan, controller, write-back and
    metrics of one run, with `step()` (one optimizer step) and `run()` (the loop)."""

    def __init__(self, cfg: C.Config, *, resume: str | Path | None = None,
                 init_from: str | Path | None = None, hooks: Sequence[Hook] = (),
                 bf16_note: bool = True) -> None:
        if resume is not None and init_from is not None:
            raise UserError("give either resume or init_from, not both")
        t = cfg.train
        self.cfg, self.hooks = cfg, list(hooks)
        self.device = pick_device(t.device)
        self.strategy = cfg.dist.strategy
        self.dist = distributed.from_env(self.strategy)
        layout = runstate.layout(self.dist, self.strategy)
        _check_batch_split(t, self.dist)  # before joining: every rank fails alike, at once
        layout.check(cfg)
        if self.device.type == "cuda" and self.dist.enabled:  # one GPU per rank, before NCCL
            self.device = torch.device("cuda", self.dist.local_rank)
            torch.cuda.set_device(self.device)
        if cfg.log.tensorboard and self.dist.is_main:
            check_tensorboard()  # before anything is written
        distributed.join(self.dist, self.device.type, timeout=cfg.dist.timeout)
        torch.set_num_threads(t.threads or max(1, (os.cpu_count() or 2) // 2))
        self.data = open_data(cfg.data, order_seed(cfg))  # first: bad data loses nothing
        self.data.dataset.check_seq_len(t.seq_len)
        source = resume if resume is not None else init_from
        flag = "--resume" if resume is not None else "--init-from"
        ckpt = checkpoint.load(checkpoint.find(Path(source), flag)) if source is not None else None
        saved = C.build(C.read_toml_text(ckpt.config_toml)) if ckpt is not None else None
        self.branched = init_from is not None
        # A branch with the parent's precision settings continues its plan and controller.
        inherit = ckpt is not None and (not self.branched or saved.precision == cfg.precision)
        model_cfg = model_config(cfg, self.data)
        if ckpt is not None:
            check_compatible(ckpt, model_cfg.to_dict(), self.data.tokenizer, flag)
        # a change --resume refuses is named before "nothing to train" (more steps would not
        # make it allowed)
        history = settings_history(cfg, saved, ckpt) if resume is not None else []
        if resume is not None:  # (a Trainer branched only to inspect the state is fine)
            check_steps_left(ckpt.path, ckpt.step, t.steps, flag)
        layout.check_fits(cfg, model_cfg, self.device, self.dist)  # before the model is built

        torch.manual_seed(cfg.seed)  # identical init on every rank
        model = build_model(model_cfg).to(self.device)
        distributed.broadcast_parameters(model, self.dist)  # (DDP checks it; FSDP shards it)
        self.plan = PrecisionPlan.from_dict(ckpt.plan) if inherit else initial_plan(cfg.precision)
        # optimizer and write-back state are loaded here: a mismatch must fail before the
        # run directory (config.toml, metrics.jsonl) is touched
        self.state = layout.build(
            cfg, convert(model, self.plan, accum=cfg.precision.accum), self.dist, ckpt,
            fresh_wrapper=self.branched and saved.writeback != cfg.writeback)
        self.dir = run_dir_for(cfg)
        start = ckpt.step if ckpt is not None else 0
        self.controller = make_controller(
            cfg.precision, self.dir / "sensitivity", self.dist.is_main, cfg.seed,
            start=start if self.branched and not inherit else 0,
            step_tokens=t.batch_size * t.seq_len, gemm=self.plan.gemm)
        self.schedule = schedule_at(t, ckpt)

        self.step_count, self.skipped = 0, 0
        self.step_seconds: deque[float] = deque(maxlen=20)  # recent step times (for the cost
        # of a statistics cycle in training steps, which the controller reports)
        self.eval_data = list(self.data.eval_batches(t.batch_size // t.grad_accum, t.seq_len,
                                                     t.eval_batches))
        self._branch_start = self.branched
        self._replan_at_start = self.branched and not inherit and self.controller is not None
        if ckpt is not None:  # everything that can fail, before the run directory is touched
            self._restore(ckpt, inherit)
        for h in self.hooks:
            h.on_build(self)

        lock = rundir.lock(self.dir) if self.dist.is_main else None  # one writer per run dir
        with rundir.released_on_error(lock):
            if self.dist.is_main:
                prepare_run_dir(self.dir, cfg, ckpt if resume is not None else None, history)
            log_path = self.dir / "metrics.jsonl" if self.dist.is_main else None
            tb = self.dir / "tensorboard" if cfg.log.tensorboard and self.dist.is_main else None
            self.log = MetricsLog(log_path, tb, lock=lock)
        # (once the run has started: a start that fails says only why; not on --resume,
        # which keeps the run's precision.accum)
        if bf16_note and resume is None:
            self._note_bf16_gemms()
        if ckpt is not None and self.branched:
            self.log.log("branch", self.step_count, parent=str(ckpt.path),
                         inherited_precision=inherit)

    # -- state ---------------------------------------------------------------------------------

    @property
    def model(self) -> nn.Module:
        return self.state.model

    @property
    def engine(self) -> nn.Module:
        """The module the training forwards call (the model, its DDP wrapper, or FSDP's)."""
        return self.state.engine

    @property
    def optimizer(self) -> torch.optim.AdamW:
        return self.state.optimizer

    @property
    def writeback(self) -> wb.Writeback | None:
        return self.state.writeback

    def _restore(self, ckpt: checkpoint.Checkpoint, inherit: bool) -> None:
        """Plan, controller, RNGs and counters (weights and optimizer are loaded already)."""
        self.plan.apply(self.model)
        if inherit and self.controller is not None and ckpt.controller is not None:
            self.controller.load_state_dict(ckpt.controller)
        checkpoint.restore_rng(ckpt.rng_of(self.dist.rank))
        self.step_count, self.skipped = ckpt.step, ckpt.meta.skipped

    def _contents(self) -> runstate.Contents:
        """What a checkpoint of this run holds beside the training state."""
        meta = checkpoint.Meta(
            model=dict(self.model.config.to_dict()), tokenizer=self.data.tokenizer,
            vocab_size=self.data.vocab_size, skipped=self.skipped,
            world_size=self.dist.world_size,
            strategy=self.strategy.value if self.dist.enabled else "none",
            schedule=self.schedule.to_dict())
        tok = self.data.dataset.tokenizer  # the checkpoint carries it (None: .bin token data)
        return runstate.Contents(
            plan=self.plan.to_dict(), meta=meta,
            tokenizer=tok.to_dict() if tok is not None else None,
            config_toml=(self.dir / "config.toml").read_text() if self.dist.is_main else "",
            controller=self.controller.state_dict() if self.controller is not None else None)

    def save(self) -> Path | None:
        """Checkpoint the current state (every rank returns once it is on disk, so no rank
        exits while it is still being written); its directory on rank 0."""
        path = self.state.save(self.dir / "checkpoints", self.step_count, self._contents,
                               self.cfg.train.keep_checkpoints)
        if path is not None:
            self.log.log("checkpoint", self.step_count, path=str(path.relative_to(self.dir)))
        return path

    def close(self) -> None:
        self.log.close()
        self.state.release_engine()  # DDP's reducer goes before the process group (teardown)
        distributed.teardown(self.dist)

    # -- one step --------------------------------------------------------------------------------

    def step(self) -> StepResult:
        """One optimizer step (module docstring, 1-4); counts it and returns what it did."""
        cfg, t, model, optimizer, dist = self.cfg, self.cfg.train, self.model, self.optimizer, \
            self.dist
        step, t0 = self.step_count, time.perf_counter()
        done = step + 1
        seed_step(cfg.seed, dist.rank, step)
        # 1. learning rate of this step
        lr = self.schedule(step)
        for group in optimizer.param_groups:
            group["lr"] = lr

        # 2. forward/backward over this rank's micro-batches
        # (DDP/FSDP average the gradients over ranks in the last micro-batch's backward)
        micro = t.batch_size // t.grad_accum // dist.world_size
        x, y = local_rows(self.data.train_batch(step, t.batch_size, t.seq_len), dist)
        loss_sum = torch.zeros((), device=self.device)
        first_row = dist.rank * (t.batch_size // dist.world_size)  # in the global batch
        with distributed.collective(dist, "the forward/backward (gradient reduction)"):
            for m in range(t.grad_accum):
                xm = x[m * micro:(m + 1) * micro].to(self.device, non_blocking=True)
                ym = y[m * micro:(m + 1) * micro].to(self.device, non_blocking=True)
                sync_quant_counters(model, step, _placed(first_row + m * micro, micro,
                                                         t.batch_size, t.seq_len))
                with distributed.gradient_sync(self.engine, m == t.grad_accum - 1):
                    with autocast(self.device, t.bf16):
                        _, loss = self.engine(xm, ym)
                    (loss / t.grad_accum).backward()
                loss_sum += loss.detach().float()
        sync_quant_counters(model, step)  # later forwards (evaluation, statistics): unplaced

        # 3. the mean loss over ranks, clip, and refuse to apply a non-finite update
        loss_val = distributed.mean_over_ranks(loss_sum / t.grad_accum, dist).item()
        with distributed.collective(dist, "the gradient norm"):
            grad_norm = distributed.local_tensor(torch.nn.utils.clip_grad_norm_(
                model.parameters(), t.grad_clip if t.grad_clip > 0 else math.inf)).item()
        finite = math.isfinite(loss_val) and math.isfinite(grad_norm)
        if not finite:
            optimizer.zero_grad(set_to_none=True)
            self._nonfinite(step, loss_val, grad_norm)
            self.skipped += 1
        else:
            # 4. the update (weights written back low-precision with --writeback.policy)
            for h in self.hooks:
                h.before_update(self)
            if self.writeback is not None:
                self.writeback.step(record=self._log_due(done))
            else:
                optimizer.step()
            for h in self.hooks:
                h.after_update(self)
            optimizer.zero_grad(set_to_none=True)
        self.step_count = done
        seconds = time.perf_counter() - t0
        self.step_seconds.append(seconds)
        return StepResult(step=done, loss=loss_val, lr=lr, grad_norm=grad_norm,
                          skipped=not finite, seconds=seconds)

    def _log_due(self, done: int) -> bool:
        return done % self.cfg.log.every == 0 or done == self.cfg.train.steps

    def _nonfinite(self, step: int, loss: float, grad_norm: float) -> None:
        """Skip and count the step, or save the last good state and stop."""
        what = f"loss {loss}, gradient norm {grad_norm}"
        self.log.log("nonfinite", step + 1, loss=loss, grad_norm=grad_norm,
                     skipped=self.skipped + 1)
        t = self.cfg.train
        if t.skip_nonfinite and self.skipped < t.max_skips:
            return
        path = self.save()
        where = f"; the last good state (step {step}) is saved in {path}" if path else ""
        hint = (f" (more than train.max_skips={t.max_skips} steps skipped)" if t.skip_nonfinite
                else ", or pass --train.skip_nonfinite true to skip such steps")
        raise NonFiniteError(
            f"non-finite {what} at step {step + 1}{where}. Lower train.lr or use a higher-"
            f"precision plan{hint}")

    # -- step boundary ---------------------------------------------------------------------------

    def evaluate(self, bar: Progress | None = None) -> EvalResult:
        """Validate now (with the plan and in high precision), log it and tell the hooks."""
        with bar.busy("validating") if bar is not None else contextlib.nullcontext():
            r = evaluate(self.model, self.eval_data, self.device, self.step_count,
                         self.cfg.train.bf16)
        self.log.log("eval", r.step, val_loss=r.loss, val_loss_hp=r.loss_hp, ppl=r.ppl)
        if bar is not None and self.dist.is_main:
            bar.write(f"step {r.step}: val loss {r.loss:.4f} (high precision {r.loss_hp:.4f}), "
                      f"ppl {r.ppl:.2f}")
        for h in self.hooks:
            h.on_eval(self, r)
        return r

    def record_plan(self, previous: PrecisionPlan | None, bar: Progress | None = None) -> float:
        """Save the plan in force from now on; returns its FP4-FLOP fraction."""
        step = self.step_count
        full = explicit(self.plan, self.model, step)
        frac = float(full.meta["fp4_flop_fraction"])
        changes = len(previous.diff(self.plan, self.model)) if previous is not None else 0
        if self.dist.is_main:
            path = self.dir / "plans" / f"step_{step}.json"
            full.to_json(path)
            self.log.log("plan", step, path=str(path.relative_to(self.dir)),
                         fp4_flop_fraction=frac, changes=changes)
            if bar is not None and previous is not None:
                bar.write(f"step {step}: new precision plan, FP4 share of linear FLOPs "
                          f"{frac:.3f}, {changes} GEMM formats changed")
        return frac

    def replan(self, bar: Progress | None = None) -> bool:
        """Ask the controller for a plan now; apply and record it if there is one."""
        if self.controller is None:
            return False
        t, dist = self.cfg.train, self.dist

        def batch_fn(i: int) -> Batch:
            # Calibration batches: training-split windows keyed far beyond any training step.
            # Every rank measures the same whole batch (the bare model, no gradient reduction),
            # so every rank's statistics and plan are those of one process.
            micro = t.batch_size // t.grad_accum
            batch = self.data.train_batch(CALIBRATION_KEY + i, micro, t.seq_len)
            return tuple(v.to(self.device) for v in batch)

        if self.step_seconds:
            self.controller.step_seconds = statistics.median(self.step_seconds)
        model, optimizer, busy = self.model, self.optimizer, contextlib.nullcontext()
        if self.controller.due(self.step_count):  # whole tensors for the statistics
            model, optimizer = self.state.full_replica(self._bare)
            if bar is not None:
                busy = bar.busy("re-planning (sensitivity statistics)")
        with busy:
            new = self.controller.on_step_end(self.step_count, model, optimizer, batch_fn)
        # rank 0's plan on every rank (they agree; this makes it a guarantee)
        new = distributed.from_rank0(new, dist, PrecisionPlan.to_dict, PrecisionPlan.from_dict)
        if new is None:
            return False
        previous, self.plan = self.plan, new  # the controller keeps the run's gemm mode
        self.plan.apply(self.model)
        self.record_plan(previous, bar)
        for h in self.hooks:
            h.on_plan_change(self, self.step_count, self.plan)
        return True

    def _bare(self) -> tuple[nn.Module, torch.optim.Optimizer]:
        """A fresh unsharded model (with the plan) and optimizer like this run's; the global
        RNG is left as it was (`distributed.full_replica` fills in the state)."""
        with torch.random.fork_rng(devices=[]):
            model = convert(build_model(self.model.config).to(self.device), self.plan,
                            accum=self.cfg.precision.accum)
        return model, make_optimizer(model, self.cfg.train)

    # -- the loop --------------------------------------------------------------------------------

    def _note_bf16_gemms(self) -> None:
        """Quantized GEMMs in fp32 on a device that multiplies bf16 natively: say on stdout
        (not stderr, where an error is one line) that ``--precision.accum auto`` would run them
        in bf16 (not the default: see its help); once a process.  ``snip compare`` and ``snip
        audit`` build their trainers with ``bf16_note=False``: their arms and runs take the
        base's or their own settings, with no ``--precision.accum`` of the user's to change;
        a resumed run is not told (``--resume`` cannot change it)."""
        global _bf16_noted
        if not _bf16_noted and self.dist.is_main and bf16_gemms_idle(self.model):
            _bf16_noted = True
            print("snip train: note: this machine multiplies bf16 natively; --precision.accum "
                  "auto runs the quantized GEMMs on bf16 operands with bf16 outputs, faster "
                  "here (README: 'What emulation costs on a CPU')")

    def _warn_if_never_replanned(self, end: int) -> None:
        """An adaptive run whose first plan falls after its last step never adapts: say so."""
        if self.controller is None or not self.dist.is_main:
            return
        if not any(self.controller.due(s) for s in range(self.step_count, end)):
            p = self.cfg.precision
            print(f"snip train: warning: precision.mode adaptive, but no re-plan falls within "
                  f"steps {self.step_count}..{end - 1} (precision.warmup {p.warmup}, "
                  f"precision.every {p.every}); the run keeps its starting plan",
                  file=sys.stderr)

    def run(self, until: int | None = None) -> RunResult:
        """Train to ``train.steps`` (or Ctrl-C), with the bookkeeping of every step boundary.

        ``until``: stop after that many steps of the ``train.steps`` schedule instead, with a
        checkpoint there (a base that branches continue on the same schedule)."""
        cfg, t = self.cfg, self.cfg.train
        end = t.steps if until is None else min(until, t.steps)
        result = RunResult(run_dir=self.dir, step=self.step_count)
        bar = Progress(t.steps, self.step_count, bar=cfg.log.progress, main=self.dist.is_main)
        if self.dist.is_main and self.step_count < end and not kernels_compiled():
            bar.write(COMPILE_NOTE)
        for h in self.hooks:
            h.on_start(self)
        self._warn_if_never_replanned(end)
        if self.step_count == 0 or self._branch_start:
            # A branch with new precision settings and a controller plans right away.
            if not (self._replan_at_start and self.replan(bar)):
                self.record_plan(None)
            self._branch_start = self._replan_at_start = False
            if self.step_count % t.eval_every == 0:  # a branch keeps the parent's cadence
                _keep_eval(result, self.evaluate())
        fp4_frac = fp4_flop_fraction(self.plan, self.model)
        t_start, window_time, window_steps = time.perf_counter(), 0.0, 0

        with StopFlag() as stop:
            while self.step_count < end:
                r = self.step()
                done = r.step
                result.losses[done], result.train_loss, result.step = r.loss, r.loss, done
                result.skipped_steps = self.skipped
                window_time, window_steps = window_time + r.seconds, window_steps + 1
                bar.update(1)
                if self._log_due(done):
                    tok_s = t.batch_size * t.seq_len * window_steps / window_time
                    wb_stats = self.writeback.metrics() if self.writeback is not None else {}
                    self.log.log("train", done, loss=r.loss, lr=r.lr, tokens_per_s=tok_s,
                                 grad_norm=r.grad_norm, fp4_flop_fraction=fp4_frac,
                                 time=time.perf_counter() - t_start, skipped=self.skipped,
                                 **wb_stats)
                    bar.set_postfix(loss=f"{r.loss:.3f}", tok_s=f"{tok_s:,.0f}")
                    window_time, window_steps = 0.0, 0
                for h in self.hooks:
                    h.after_step(self, r)
                if done % t.eval_every == 0 or done in (t.steps, end):
                    _keep_eval(result, self.evaluate(bar))
                if done < t.steps and self.replan(bar):  # no plan that would never run
                    fp4_frac = fp4_flop_fraction(self.plan, self.model)
                if done % t.ckpt_every == 0 or done in (t.steps, end):
                    self.save()
                if distributed.any_rank(stop.set, self.dist):
                    if done % t.ckpt_every and done not in (t.steps, end):
                        self.save()
                    # a stop on the last step is a finished run: it is evaluated and saved
                    result.interrupted = done < end
                    break
        bar.close()
        result.seconds = time.perf_counter() - t_start
        return result


def _keep_eval(result: RunResult, r: EvalResult) -> None:
    result.evals.append(r)
    result.val_loss, result.val_loss_hp = r.loss, r.loss_hp


def train(cfg: C.Config, resume: str | Path | None = None, init_from: str | Path | None = None,
          hooks: Sequence[Hook] = (), until: int | None = None) -> RunResult:
    """Train according to ``cfg`` (resolved, see `config.from_sources`); the final numbers.
    ``until``: stop (with a checkpoint) after that many steps of the schedule."""
    if init_from is not None:  # a branch that would train nothing: say so, write nothing
        path = checkpoint.find(Path(init_from), "--init-from")
        try:
            step = int(json.loads((path / "meta.json").read_text())["step"])
        except (OSError, ValueError, KeyError, TypeError):
            step = -1  # damaged: the trainer names it
        check_steps_left(path, step, cfg.train.steps, "--init-from")
    trainer = Trainer(cfg, resume=resume, init_from=init_from, hooks=hooks)
    try:
        return trainer.run(until)
    finally:
        trainer.close()


# ---------------------------------------------------------------------------------------------
# Setting up: checks before anything is written, and the run directory.


def _check_batch_split(t: C.TrainSection, dist: distributed.DistInfo) -> None:
    if t.batch_size % (t.grad_accum * dist.world_size):
        raise UserError(f"train.batch_size={t.batch_size} must be divisible by train.grad_accum"
                        f" x world size = {t.grad_accum} x {dist.world_size}")
