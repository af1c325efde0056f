"""Two CPU processes (gloo) with the same global batch against one process (fp32 plan).

With no rounding to flip, two DDP ranks equal one process with two micro-batches bit for bit
(the same operations in the same order, see ``parity.py``), and one process with the whole
batch within fp32 rounding: its token GEMMs and loss mean sum 128 terms where the split runs
sum two halves of 64, a relative difference of at most ~128 x 2^-24 ~ 8e-6 per reduction and
typically sqrt(128) x 2^-24 ~ 7e-7, which AdamW's normalised updates do not amplify over 6 steps
(measured 9.5e-8 on an AVX2 EPYC by ``benchmarks/parity_spread.py``; the bound is 1e-5).
"""

from __future__ import annotations

import weakref
from pathlib import Path

import pytest
import torch.distributed as dist
from parity import assert_bitwise, losses, one_process, two_ranks

from snip.train.loop import Hook, Trainer


def test_two_gloo_ranks_match_one_process(tiny: dict) -> None:
    settings = {**tiny, "train.steps": 6, "train.eval_every": 6, "train.ckpt_every": 6,
                "precision.preset": "fp32"}
    one_process({**settings, "run.name": "one"})
    one_process({**settings, "run.name": "accum", "train.grad_accum": 2})
    two_ranks({**settings, "run.name": "two"})
    runs = Path(tiny["run.dir"])
    assert_bitwise(runs / "accum", runs / "two")
    one, two = losses(runs / "one"), losses(runs / "two")
    assert sorted(one) == sorted(two) == list(range(1, 7))
    assert list(two.values()) == pytest.approx(list(one.values()), rel=1e-5, abs=0)


class CheckTeardownOrder(Hook):
    """On each rank: when the process group is destroyed, is the DDP wrapper (and with it its C++
    reducer, which holds the group) already freed?  If it were not, the reducer would drop the
    group's last reference with the GIL held and gloo's destructor could deadlock at exit
    (``distributed.teardown``); the deadlock itself is a race (about 1 in 5 runs here), the
    order that prevents it is not."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def on_start(self, trainer: Trainer) -> None:
        wrapper = weakref.ref(trainer.engine)
        assert wrapper() is not trainer.model  # a DDP wrapper, not the bare model
        destroy, out, rank = dist.destroy_process_group, self.out, trainer.dist.rank

        def checked(*args: object, **kwargs: object) -> None:
            (out / f"rank{rank}.txt").write_text("freed" if wrapper() is None else "alive")
            destroy(*args, **kwargs)

        dist.destroy_process_group = checked  # this spawned rank's own module


def test_ddp_wrapper_is_freed_before_the_process_group(tiny: dict, tmp_path: Path) -> None:
    two_ranks({**tiny, "train.steps": 2, "train.eval_every": 2, "train.ckpt_every": 2,
               "precision.preset": "fp32", "run.name": "two"},
              hooks=[CheckTeardownOrder(tmp_path)])
    assert [(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)] == ["freed", "freed"]
