"""Where a `snip train` run's time goes, by the trainer's methods (descriptive, one process): one
250-step `small` run, fixed precision at the preset given, 1 thread, after a 2-step warm-up run;
the wall seconds inside ``evaluate``, ``save``, ``step`` and ``replan``, and the whole run.
How session 20 found that evaluation is most of the end-to-end overhead (issue 21).
``--two-passes``: evaluate as before ``d36807fc`` (a second, high-precision pass even where the
forward is plain fp32).

    PYTHONPATH=src python benchmarks/results/issue21/epyc/session20/eval_probe.py \
        fp32 [--two-passes]
"""

import collections
import contextlib
import io
import sys
import tempfile
import time

import torch

from snip.train import evaluation, from_sources, train
from snip.train.loop import Trainer

acc: dict[str, float] = collections.defaultdict(float)
cnt: collections.Counter = collections.Counter()


def timed(name: str) -> None:
    f = getattr(Trainer, name)

    def w(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            acc[name] += time.perf_counter() - t
            cnt[name] += 1
    setattr(Trainer, name, w)


def main() -> None:
    torch.set_num_threads(1)
    if "--two-passes" in sys.argv:
        evaluation.plain_forward = lambda model: False
    for name in ("evaluate", "save", "step", "replan"):
        timed(name)
    with tempfile.TemporaryDirectory() as tmp:
        ov = {"model.name": "small", "train.steps": 250, "train.threads": 1,
              "log.progress": False, "run.dir": tmp, "precision.mode": "fixed",
              "precision.preset": sys.argv[1]}
        with contextlib.redirect_stdout(io.StringIO()):
            train(from_sources(overrides={**ov, "train.steps": 2, "run.name": "warm"}))
        acc.clear()
        cnt.clear()
        t = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            train(from_sources(overrides={**ov, "run.name": "run"}))
        total = time.perf_counter() - t
    print(f"{' '.join(sys.argv[1:])}: whole run {total:.2f} s; "
          + ", ".join(f"{k} {v:.2f} s ({cnt[k]} calls)" for k, v in acc.items()))


if __name__ == "__main__":
    main()
