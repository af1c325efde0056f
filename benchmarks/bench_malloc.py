"""Does ``snip.runtime.tune_malloc()`` still speed up the training loop?

    .venv/bin/python benchmarks/bench_malloc.py [--steps 40] [--rounds 3] [--threads 1]

``snip train`` calls :func:`snip.runtime.tune_malloc` (glibc: keep large freed blocks instead
of unmapping them) unless ``SNIP_MALLOPT=0``.  The quantizers no longer need it (they recycle
their own output buffers); this benchmark measures whether the rest of a training step
(autograd temporaries, optimizer) still gains from it.

Each round runs ``snip train`` (default config: small model on the embedded corpus, ``--steps``
steps, logging every step) twice in fresh child processes, once with ``SNIP_MALLOPT=1`` and
once with ``SNIP_MALLOPT=0``, in alternating order.  A child's step time is the median over its
logged steps (after the first ``--skip``) of ``tokens per step / tokens_per_s``.  Reported: the
per-round ratio ``step(tuned) / step(untuned)``, its median, and the mean paired difference of
step times with a 95% t-interval over the rounds (n = rounds).  Also the minor page faults of
each child and its user and system CPU seconds (``getrusage`` of the children): page faults
are a load-independent witness of fresh memory touched, system time is what they cost.

Writes ``benchmarks/out/bench_malloc.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    from benchmarks._util import cpu_info, write_json
except ImportError:  # run as a script from the benchmarks directory
    from _util import cpu_info, write_json

OUT = Path(__file__).parent / "out" / "bench_malloc.json"
T975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}


def run_child(tuned: bool, steps: int, threads: int, skip: int, tmp: str, tag: str) -> dict:
    env = {**os.environ, "SNIP_MALLOPT": "1" if tuned else "0", "OMP_NUM_THREADS": str(threads),
           "NUMBA_NUM_THREADS": str(threads)}
    cmd = [sys.executable, "-m", "snip.cli", "train", "--train.steps", str(steps),
           "--train.threads", str(threads), "--log.every", "1", "--log.progress", "false",
           "--train.eval_every", "100000", "--train.ckpt_every", "100000",
           "--run.dir", tmp, "--run.name", tag]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    events = [json.loads(line) for line in (Path(tmp) / tag / "metrics.jsonl").open()]
    train = [e for e in events if e.get("event") == "train"]
    cfg = (Path(tmp) / tag / "config.toml").read_text()
    tokens = _tokens_per_step(cfg)
    step_s = [tokens / e["tokens_per_s"] for e in train[skip:]]
    return {"tuned": tuned, "median_step_s": statistics.median(step_s), "n_steps": len(step_s),
            "wall_s": wall, "minor_faults": after.ru_minflt - before.ru_minflt,
            "user_s": after.ru_utime - before.ru_utime, "sys_s": after.ru_stime - before.ru_stime}


def _tokens_per_step(cfg: str) -> int:
    vals = {}
    for line in cfg.splitlines():
        line = line.split("#", 1)[0]
        if "=" in line:
            k, v = (s.strip() for s in line.split("=", 1))
            vals[k] = v
    return int(vals["batch_size"]) * int(vals["seq_len"]) * int(vals.get("grad_accum", "1"))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip", type=int, default=5, help="first logged steps left out (warm-up)")
    args = ap.parse_args(argv)
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = (True, False) if r % 2 == 0 else (False, True)
            res = {t: run_child(t, args.steps, args.threads, args.skip, tmp, f"r{r}_{int(t)}")
                   for t in order}
            rounds.append({"tuned": res[True], "untuned": res[False],
                           "ratio": res[True]["median_step_s"] / res[False]["median_step_s"]})
            print(f"round {r}: step tuned {res[True]['median_step_s'] * 1e3:.1f} ms, untuned "
                  f"{res[False]['median_step_s'] * 1e3:.1f} ms, ratio {rounds[-1]['ratio']:.3f}; "
                  f"minor faults {res[True]['minor_faults']} vs {res[False]['minor_faults']}; "
                  f"CPU user+sys {res[True]['user_s']:.1f}+{res[True]['sys_s']:.1f} s vs "
                  f"{res[False]['user_s']:.1f}+{res[False]['sys_s']:.1f} s",
                  flush=True)
    diffs = [(x["tuned"]["median_step_s"] - x["untuned"]["median_step_s"]) * 1e3 for x in rounds]
    n = len(diffs)
    mean = statistics.fmean(diffs)
    half = T975.get(n - 1, 1.96) * statistics.stdev(diffs) / n**0.5 if n > 1 else float("nan")
    summary = {"median_ratio": statistics.median(x["ratio"] for x in rounds),
               "mean_diff_ms": mean, "ci95_ms": [mean - half, mean + half], "n": n}
    print(f"tuned / untuned step time: median ratio {summary['median_ratio']:.3f}; paired "
          f"difference {mean:+.1f} ms, 95% CI [{mean - half:+.1f}, {mean + half:+.1f}] (n={n})")
    print(f"load average {os.getloadavg()}; CPU: {cpu_info()}")
    write_json(OUT.name, {"args": vars(args), "rounds": rounds, "summary": summary,
                     "cpu": cpu_info(), "loadavg": os.getloadavg(),
                     "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())})


if __name__ == "__main__":
    main()
