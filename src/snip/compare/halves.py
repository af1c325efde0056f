"""Validation losses on two disjoint halves of a branch's windows, for selection without bias.

A *search oracle* picks the best of K plans by their validation loss.  Picking and reporting on
the same windows would let the winner's luck on those windows count as quality (the maximum of
K noisy numbers is biased low).  So every finished branch is also evaluated on the even-indexed
and the odd-indexed windows of its final evaluation separately: a selection made on half ``a``
(the even windows) is reported on half ``b`` (the odd ones), which played no part in it
(`snip.compare.stats.search_oracle`).  The mean of the two halves is the branch's full
validation loss whenever the window count is even (each window weighs the same).

The losses come from the branch's final checkpoint (`snip.train.inference.load`: its weights and
its last plan), on the same strided windows as the trainer's evaluation, as it runs quantized
(``val_loss_a``, ``val_loss_b``) and in high precision (``val_loss_hp_a``, ``val_loss_hp_b``).
"""

from __future__ import annotations

from pathlib import Path

HALF_METRICS = ("val_loss_hp_a", "val_loss_hp_b", "val_loss_a", "val_loss_b")


def half_losses(run_dir: Path, eval_batches: int) -> dict[str, float]:
    """The four half losses of the finished branch in ``run_dir`` (empty for fewer than two
    windows, where there are no two halves)."""
    if eval_batches < 2:
        return {}
    from snip.train.evaluation import evaluate
    from snip.train.inference import load

    loaded = load(run_dir)
    t = loaded.cfg.train
    windows = list(loaded.data.eval_batches(t.batch_size // t.grad_accum, t.seq_len,
                                            eval_batches))
    out: dict[str, float] = {}
    for half, part in (("a", windows[0::2]), ("b", windows[1::2])):
        r = evaluate(loaded.model, part, loaded.device, loaded.step, t.bf16)
        out[f"val_loss_hp_{half}"], out[f"val_loss_{half}"] = r.loss_hp, r.loss
    return out
