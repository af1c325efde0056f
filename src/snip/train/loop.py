"""The training loop, readable top to bottom (in the spirit of nanoGPT's train.py).

    train(config)                    a fresh run in runs/NAME
    train(config, resume=RUN_DIR)    continue the newest checkpoint of RUN_DIR (or a given
                                     checkpoint directory) exactly where it stopped

One optimizer step:

1. the learning rate for this step (linear warm-up, then cosine down to ``min_lr_ratio * lr``);
2. the step's global batch (a pure function of the step) and this rank's rows of it, split into
   ``grad_accum`` micro-batches; forward (optionally under bf16 autocast) and backward each,
   scaling the loss by 1/grad_accum so the gradients add up to the mean;
3. average the gradients over ranks, clip their global norm, and stop -- or skip the step with
   ``train.skip_nonfinite`` -- if the loss or the gradient is not finite;
4. AdamW step (decoupled weight decay on matrices only), through the weight write-back wrapper
   when ``writeback.policy`` is set (see `snip.train.writeback`);
5. then, with the step counted: log, validate, let an adaptive precision controller re-plan,
   checkpoint; Ctrl-C is noticed here and saves before exiting.

Numerics are seeded end to end: the model init, the data (per step) and every RNG stream that
quantization may draw from are restored from checkpoints, so a resumed run reproduces the loss
sequence of an uninterrupted one bit for bit (same device, same thread count).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from snip.errors import UserError
from snip.models import build_model, get_config
from snip.nn import convert, qlinear_layers
from snip.plan import PrecisionPlan, fp4_flop_fraction
from snip.train import checkpoint, distributed, rundir
from snip.train import config as C
from snip.train import writeback as wb
from snip.train.batches import Batch, Batches, open_data
from snip.train.metrics import MetricsLog, progress_bar, truncate_after
from snip.train.precision import explicit, initial_plan, make_controller

CALIBRATION_KEY = 10**12  # data "step" of the controller's calibration batches


class NonFiniteError(RuntimeError):
    """The loss or gradient became NaN/inf; the last good state has been checkpointed."""


@dataclass
class RunResult:
    run_dir: Path
    step: int
    train_loss: float = math.nan
    val_loss: float = math.nan
    interrupted: bool = False
    skipped_steps: int = 0
    seconds: float = 0.0
    losses: dict[int, float] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Small pieces the loop is made of.


def lr_at(step: int, t: C.TrainSection) -> float:
    """Linear warm-up to ``lr`` over ``warmup_steps``, then cosine decay to the floor."""
    if step < t.warmup_steps:
        return t.lr * (step + 1) / (t.warmup_steps + 1)
    ratio = (step - t.warmup_steps) / max(1, t.steps - t.warmup_steps)
    coeff = 0.5 * (1.0 + math.cos(math.pi * min(1.0, ratio)))
    return t.lr * (t.min_lr_ratio + (1.0 - t.min_lr_ratio) * coeff)


def make_optimizer(model: nn.Module, t: C.TrainSection) -> torch.optim.AdamW:
    """AdamW with weight decay on weight matrices only: norm gains, biases and embeddings
    are not decayed (shrinking them towards zero has no regularizing meaning)."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 and id(p) not in embeddings else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": t.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=t.lr, betas=(t.beta1, t.beta2))


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"train.device={name!r} but CUDA is not available; use cpu or auto")
    return torch.device(name)


def set_threads(n: int) -> None:
    """Use ``n`` CPU threads in torch, and so in the numba quantization kernels (which follow
    ``torch.get_num_threads()``): on a shared machine, oversubscribed kernel threads make small
    quantized models many times slower."""
    torch.set_num_threads(n)


def sync_quant_counters(model: nn.Module, count: int) -> None:
    """Set every QLinear's forward counter (which seeds its stochastic rounding) from the step,
    so that the noise is a pure function of the step: exact resume, and evaluation forwards
    never shift the training noise."""
    for _, m in qlinear_layers(model):
        m.step = count


def local_rows(batch: Batch, dist: distributed.DistInfo) -> Batch:
    """This rank's contiguous share of the global batch."""
    x, y = batch
    n = x.shape[0] // dist.world_size
    return x[dist.rank * n:(dist.rank + 1) * n], y[dist.rank * n:(dist.rank + 1) * n]


def autocast(device: torch.device, enabled: bool) -> contextlib.AbstractContextManager:
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled)


@torch.no_grad()
def evaluate(model: nn.Module, data: Batches, cfg: C.Config, device: torch.device) -> float:
    """Mean validation loss over the fixed held-out batches. Every rank evaluates the same
    batches (no communication needed), under a forked RNG so that evaluating never shifts the
    training random streams."""
    t = cfg.train
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        model.eval()
        losses = []
        for x, y in data.eval_batches(t.batch_size // t.grad_accum, t.seq_len, t.eval_batches):
            with autocast(device, t.bf16):
                _, loss = model(x.to(device), y.to(device))
            losses.append(loss.float())
        model.train()
    return torch.stack(losses).mean().item()


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


# ---------------------------------------------------------------------------------------------
# Setting up a run: fresh or resumed.


@dataclass
class Run:
    """Everything the loop mutates, in one place."""

    cfg: C.Config
    dir: Path
    dist: distributed.DistInfo
    device: torch.device
    data: Batches
    model: nn.Module
    optimizer: torch.optim.AdamW
    plan: PrecisionPlan
    controller: Any
    log: MetricsLog
    writeback: wb.Writeback | None = None  # the optimizer's write-back wrapper, if any
    step: int = 0
    skipped: int = 0

    def save(self, step: int) -> Path | None:
        """Checkpoint the current state as ``step`` steps completed (rank 0 writes; every rank
        waits until it is on disk, so no rank exits while rank 0 is still saving)."""
        if not self.dist.is_main:
            distributed.barrier(self.dist, "waiting for rank 0 to save a checkpoint")
            return None
        meta = {"skipped": self.skipped, "world_size": self.dist.world_size,
                "model": dict(self.model.config.to_dict()), "tokenizer": self.data.tokenizer,
                "vocab_size": self.data.vocab_size}
        state = self.controller.state_dict() if self.controller is not None else None
        writeback = self.writeback.state_dict() if self.writeback is not None else None
        path = checkpoint.save(
            self.dir / "checkpoints", step, model=self.model, optimizer=self.optimizer,
            plan=self.plan.to_dict(), config_toml=C.to_toml(self.cfg), meta=meta,
            controller=state, writeback=writeback, keep=self.cfg.train.keep_checkpoints)
        self.log.log("checkpoint", step, path=str(path.relative_to(self.dir)))
        distributed.barrier(self.dist, "waiting for rank 0 to save a checkpoint")
        return path

    def record_plan(self, step: int, previous: PrecisionPlan | None) -> float:
        """Save the plan in force from ``step`` on; returns its FP4-FLOP fraction."""
        full = explicit(self.plan, self.model, step)
        frac = float(full.meta["fp4_flop_fraction"])
        if self.dist.is_main:
            path = self.dir / "plans" / f"step_{step}.json"
            full.to_json(path)
            changes = len(previous.diff(self.plan, self.model)) if previous is not None else 0
            self.log.log("plan", step, path=str(path.relative_to(self.dir)),
                         fp4_flop_fraction=frac, changes=changes)
        return frac


def run_dir_for(cfg: C.Config) -> Path:
    return Path(cfg.run.dir) / cfg.run.name


def setup(cfg: C.Config, resume: Path | None = None) -> Run:
    """Build data, model, plan, optimizer and controller; restore them from a checkpoint."""
    t = cfg.train
    device = pick_device(t.device)
    dist = distributed.setup(device.type, timeout=cfg.dist.timeout)
    if device.type == "cuda" and dist.enabled:
        device = torch.device("cuda", dist.local_rank)
    set_threads(t.threads or max(1, (os.cpu_count() or 2) // 2))
    _check_batch_split(t, dist)
    data = open_data(cfg.data, cfg.seed)  # before creating anything: bad data loses nothing
    data.dataset.check_seq_len(t.seq_len)
    ckpt = checkpoint.load(checkpoint.find(resume)) if resume is not None else None
    model_cfg = get_config(cfg.model.name, vocab_size=data.vocab_size,
                           max_seq_len=max(t.seq_len, get_config(cfg.model.name).max_seq_len))
    if ckpt is not None:
        _check_compatible(ckpt, model_cfg.to_dict(), data.tokenizer)

    torch.manual_seed(cfg.seed)  # identical init on every rank
    model = build_model(model_cfg).to(device)
    distributed.broadcast_parameters(model, dist)
    plan = PrecisionPlan.from_dict(ckpt.plan) if ckpt is not None else initial_plan(cfg.precision)
    model = convert(model, plan)
    optimizer = make_optimizer(model, t)
    writeback = wb.attach(cfg.writeback, model, optimizer, cfg.seed)
    if ckpt is not None:  # optimizer (+ write-back) state first: a mismatch must fail before
        # the run directory (config.toml, metrics.jsonl) is touched
        wb.restore(writeback, optimizer, ckpt.optimizer, ckpt.writeback, ckpt.path)
    run_dir = run_dir_for(cfg)
    controller = make_controller(cfg.precision, run_dir / "sensitivity", dist.is_main,
                                 cfg.seed)

    lock = rundir.lock(run_dir) if dist.is_main else None  # one writer per run directory
    with rundir.released_on_error(lock):
        if dist.is_main:
            _prepare_run_dir(run_dir, cfg, ckpt)
    log = MetricsLog(run_dir / "metrics.jsonl" if dist.is_main else None,
                     run_dir / "tensorboard" if cfg.log.tensorboard and dist.is_main else None,
                     lock=lock)
    run = Run(cfg=cfg, dir=run_dir, dist=dist, device=device, data=data, model=model,
              optimizer=optimizer, plan=plan, controller=controller, log=log,
              writeback=writeback)
    if ckpt is not None:
        with rundir.released_on_error(lock):
            _restore(run, ckpt)
    return run


def _check_batch_split(t: C.TrainSection, dist: distributed.DistInfo) -> None:
    if t.batch_size % (t.grad_accum * dist.world_size):
        raise UserError(f"train.batch_size={t.batch_size} must be divisible by train.grad_accum"
                        f" x world size = {t.grad_accum} x {dist.world_size}")


def _check_compatible(ckpt: checkpoint.Checkpoint, model: dict, tokenizer: str) -> None:
    saved = ckpt.meta.get("model", {})
    # max_seq_len only bounds the input length (RoPE has no position weights): not a shape.
    diff = {k: (saved.get(k), v) for k, v in model.items()
            if saved.get(k) != v and k != "max_seq_len"}
    if diff:
        k, (old, new) = next(iter(diff.items()))
        raise UserError(f"cannot resume {ckpt.path}: it holds a different model shape "
                        f"({k}={old}, this config gives {new}); resume with the run's own "
                        "model.name and data settings")
    if ckpt.meta.get("tokenizer") != tokenizer:
        raise UserError(f"cannot resume {ckpt.path}: it was trained with tokenizer "
                        f"{ckpt.meta.get('tokenizer')!r}, this config uses {tokenizer!r}")


def _prepare_run_dir(run_dir: Path, cfg: C.Config, ckpt: checkpoint.Checkpoint | None) -> None:
    if ckpt is None and checkpoint.list_checkpoints(run_dir / "checkpoints"):
        raise UserError(f"run directory {run_dir} already holds checkpoints; continue it with "
                        f"--resume {run_dir} or choose another --run.name")
    for sub in ("plans", "checkpoints", "sensitivity"):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    C.write_toml(cfg, run_dir / "config.toml")
    if ckpt is None:
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)
        for old in (run_dir / "plans").glob("step_*.json"):
            old.unlink()
    else:  # the resumed run rewrites history after its checkpoint
        truncate_after(run_dir / "metrics.jsonl", ckpt.step)
        for old in (run_dir / "plans").glob("step_*.json"):
            if int(old.stem.split("_")[1]) > ckpt.step:
                old.unlink()


def _restore(run: Run, ckpt: checkpoint.Checkpoint) -> None:
    """Weights, controller, RNGs and counters (the optimizer state is loaded in `setup`)."""
    ckpt.load_weights(run.model)
    run.plan.apply(run.model)
    if run.controller is not None and ckpt.controller is not None:
        run.controller.load_state_dict(ckpt.controller)
    checkpoint.restore_rng(ckpt.rng)
    run.step, run.skipped = ckpt.step, int(ckpt.meta.get("skipped", 0))


def seed_step(seed: int, rank: int, step: int) -> None:
    """Reseed the global RNGs at the start of every step: whatever quantization or a controller
    draws is then a pure function of (seed, rank, step), so resuming needs no RNG history and
    every rank still gets its own stream."""
    torch.manual_seed((seed * 1_000_003 + step) * 1024 + rank)


# ---------------------------------------------------------------------------------------------
# The loop.


def train(cfg: C.Config, resume: str | Path | None = None) -> RunResult:
    """Train according to ``cfg`` (resolved, see `config.resolve`); returns the final numbers."""
    run = setup(cfg, Path(resume) if resume is not None else None)
    try:
        return _train(run)
    finally:
        run.log.close()
        distributed.teardown(run.dist)


def _train(run: Run) -> RunResult:
    cfg, t, model, optimizer, dist = run.cfg, run.cfg.train, run.model, run.optimizer, run.dist
    result = RunResult(run_dir=run.dir, step=run.step)
    micro = t.batch_size // t.grad_accum // dist.world_size
    tokens_per_step = t.batch_size * t.seq_len
    fp4_frac = fp4_flop_fraction(run.plan, model)
    if run.step == 0:
        fp4_frac = run.record_plan(0, None)
        result.val_loss = _eval_and_log(run, 0)
    bar = progress_bar(t.steps, run.step, cfg.log.progress and dist.is_main)
    t_start, window_time, window_steps = time.perf_counter(), 0.0, 0

    with StopFlag() as stop:
        for step in range(run.step, t.steps):
            t0 = time.perf_counter()
            done = step + 1
            log_now = done % cfg.log.every == 0 or done == t.steps
            seed_step(cfg.seed, dist.rank, step)
            # 1. learning rate of this step
            lr = lr_at(step, t)
            for group in optimizer.param_groups:
                group["lr"] = lr

            # 2. forward/backward over this rank's micro-batches
            x, y = local_rows(run.data.train_batch(step, t.batch_size, t.seq_len), dist)
            loss_sum = torch.zeros((), device=run.device)
            for m in range(t.grad_accum):
                xm = x[m * micro:(m + 1) * micro].to(run.device, non_blocking=True)
                ym = y[m * micro:(m + 1) * micro].to(run.device, non_blocking=True)
                sync_quant_counters(model, step * t.grad_accum + m)
                with autocast(run.device, t.bf16):
                    _, loss = model(xm, ym)
                (loss / t.grad_accum).backward()
                loss_sum += loss.detach().float()

            # 3. average over ranks, clip, and refuse to apply a non-finite update
            distributed.average_gradients(model, dist)
            loss_val = distributed.mean_over_ranks(loss_sum / t.grad_accum, dist).item()
            grad_norm = torch.nn.utils.clip_grad_norm_(
                model.parameters(), t.grad_clip if t.grad_clip > 0 else math.inf).item()
            if not (math.isfinite(loss_val) and math.isfinite(grad_norm)):
                optimizer.zero_grad(set_to_none=True)
                _nonfinite(run, step, loss_val, grad_norm)
                run.skipped += 1
                result.skipped_steps = run.skipped
            else:
                # 4. the update (weights written back low-precision with --writeback.policy)
                if run.writeback is not None:
                    run.writeback.step(record=log_now)
                else:
                    optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            result.losses[done], result.train_loss, result.step = loss_val, loss_val, done
            window_time, window_steps = window_time + time.perf_counter() - t0, window_steps + 1

            # 5. bookkeeping at the step boundary
            bar.update(1)
            if log_now:
                tok_s = tokens_per_step * window_steps / window_time  # training time only
                wb_stats = run.writeback.metrics() if run.writeback is not None else {}
                run.log.log("train", done, loss=loss_val, lr=lr, tokens_per_s=tok_s,
                            grad_norm=grad_norm, fp4_flop_fraction=fp4_frac,
                            time=time.perf_counter() - t_start, skipped=run.skipped, **wb_stats)
                bar.set_postfix(loss=f"{loss_val:.3f}", tok_s=f"{tok_s:,.0f}")
                window_time, window_steps = 0.0, 0
            if done % t.eval_every == 0 or done == t.steps:
                result.val_loss = _eval_and_log(run, done, bar)
            fp4_frac = _maybe_replan(run, done, fp4_frac)
            if done % t.ckpt_every == 0 or done == t.steps:
                run.save(done)
            if distributed.any_rank(stop.set, dist):
                if done % t.ckpt_every and done != t.steps:
                    run.save(done)
                result.interrupted = True
                break
    bar.close()
    result.seconds = time.perf_counter() - t_start
    return result


def _eval_and_log(run: Run, step: int, bar: Any = None) -> float:
    val = evaluate(run.model, run.data, run.cfg, run.device)
    ppl = math.exp(min(val, 50.0))
    run.log.log("eval", step, val_loss=val, ppl=ppl)
    if bar is not None and run.dist.is_main:
        bar.write(f"step {step}: val loss {val:.4f}, ppl {ppl:.2f}")
    return val


def _maybe_replan(run: Run, step: int, fp4_frac: float) -> float:
    """Ask the controller for a new plan; apply and record it if there is one."""
    if run.controller is None:
        return fp4_frac
    t = run.cfg.train

    def batch_fn(i: int) -> Batch:
        # Calibration batches: training-split windows keyed far beyond any training step.
        micro = t.batch_size // t.grad_accum
        batch = run.data.train_batch(CALIBRATION_KEY + i, micro, t.seq_len)
        return tuple(v.to(run.device) for v in local_rows(batch, run.dist))

    new = run.controller.on_step_end(step, run.model, run.optimizer, batch_fn)
    if new is None:
        return fp4_frac
    previous, run.plan = run.plan, new
    run.plan.apply(run.model)
    return run.record_plan(step, previous)


def _nonfinite(run: Run, step: int, loss: float, grad_norm: float) -> None:
    """Skip and count the step, or save the last good state and stop."""
    what = f"loss {loss}, gradient norm {grad_norm}"
    run.log.log("nonfinite", step + 1, loss=loss, grad_norm=grad_norm, skipped=run.skipped + 1)
    t = run.cfg.train
    if t.skip_nonfinite and run.skipped < t.max_skips:
        return
    path = run.save(step)
    where = f"; the last good state (step {step}) is saved in {path}" if path else ""
    hint = (f" (more than train.max_skips={t.max_skips} steps skipped)" if t.skip_nonfinite
            else ", or pass --train.skip_nonfinite true to skip such steps")
    raise NonFiniteError(
        f"non-finite {what} at step {step + 1}{where}. Lower train.lr or use a higher-precision "
        f"plan{hint}")
