"""How many elements should a quantizer call have before its numba kernel uses a second thread?
(issue 21, ``snip.formats.fast._PARALLEL_MIN``)

Torch's GEMMs use every thread ``torch.set_num_threads`` allows; snip's quantizer kernels use
them only from ``_PARALLEL_MIN`` elements up, because a parallel region wakes every thread and
on a loaded machine the slowest wake-up can cost more than a small tensor's work.  This times
fwd + bwd + AdamW steps of ``bench_train_step``'s models at 2 threads, plain fp32 against mxfp4
and nvfp4 at three fixed thresholds (2^20, 2^16, 2^14) and the default, adaptive one (2^20,
with calls of 2^14 elements or more timed both ways and run the faster way:
``fast._ThreadChoice``), all in one process with the settings interleaved per round (2 warm-up
rounds, 8 timed; median wall ms and median per-round ratio to the fp32 step).  Run it on a
quiet machine, then with a busy loop on one core at equal priority (``python3 -c "while True:
pass" &``) for the loaded case.

    PYTHONPATH=src python benchmarks/bench_parallel_min.py [--out rounds.json]

``--out`` writes every round's wall seconds per (case, preset, setting), for paired
per-round comparisons of two settings.  ``--cases``, ``--presets`` (``mxfp4@auto``: with
``accum="auto"``), ``--settings`` (thresholds in elements, or ``adaptive``), ``--rounds`` and
``--warmup`` choose other runs than the defaults above, e.g. session 23's (RESULTS §7ba)::

    PYTHONPATH=src python benchmarks/bench_parallel_min.py --cases tiny-deep:8x128 small:4x256 \
        --presets mxfp4 nvfp4 mxfp4@auto nvfp4@auto --settings adaptive 16384 --rounds 20
"""

import argparse
import json
import statistics
import sys

import torch

try:
    from benchmarks._util import cpu_info
    from benchmarks.bench_train_step import Arm, model_config
except ImportError:  # run as a script from the benchmarks directory
    from _util import cpu_info
    from bench_train_step import Arm, model_config
from snip.formats import fast

CASES = [("small", (4, 256)), ("small", (16, 256)), ("medium", (4, 256))]
SETTINGS = [1 << 20, 1 << 16, 1 << 14, "adaptive"]


def _use(setting: int | str) -> None:
    """A fixed threshold, or the default adaptive choice."""
    fast._ADAPT = setting == "adaptive"
    fast._PARALLEL_MIN = 1 << 20 if fast._ADAPT else setting


def _case(text: str) -> tuple[str, tuple[int, int]]:
    """``model:BxT`` (batch x sequence length) as ``(model, (B, T))``."""
    name, _, shape = text.partition(":")
    b, _, t = shape.partition("x")
    return name, (int(b), int(t))


def _setting(text: str) -> int | str:
    return text if text == "adaptive" else int(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="JSON file for every round's wall seconds")
    ap.add_argument("--cases", nargs="+", type=_case, default=CASES,
                    help="model:BxT, e.g. tiny-deep:8x128 (default: %(default)s)")
    ap.add_argument("--presets", nargs="+", default=["mxfp4", "nvfp4"])
    ap.add_argument("--settings", nargs="+", type=_setting, default=SETTINGS,
                    help="thresholds in elements, or adaptive (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=8, help="timed rounds")
    ap.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    args = ap.parse_args()
    torch.set_num_threads(2)
    settings, presets = args.settings, args.presets
    rounds: dict = {}
    for name, (b, t) in args.cases:
        g = torch.Generator().manual_seed(1)
        tok = torch.randint(model_config(name).vocab_size, (b, t + 1), generator=g)
        batch = (tok[:, :-1].contiguous(), tok[:, 1:].contiguous())
        arms = {a: Arm(name, a, batch) for a in ("fp32", *presets)}
        res: dict = {("fp32", 0): []}
        for a in presets:
            for s in settings:
                res[(a, s)] = []
        for _ in range(args.warmup):
            arms["fp32"].step()
            for a in presets:
                for s in settings:
                    _use(s)
                    arms[a].step()
        for r in range(args.rounds):
            res[("fp32", 0)].append(arms["fp32"].step()[0])
            for a in presets:
                for s in (settings if r % 2 == 0 else settings[::-1]):
                    _use(s)
                    res[(a, s)].append(arms[a].step()[0])
        base = res[("fp32", 0)]
        for k, v in res.items():
            ratio = statistics.median(x / y for x, y in zip(v, base, strict=True))
            print(name, b * t, k, f"{statistics.median(v) * 1e3:.1f} ms",
                  f"ratio {ratio:.3f}", flush=True)
            rounds[f"{name} {b * t} {k[0]} {k[1]}"] = v
    _use("adaptive")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"cpu": cpu_info(), "argv": sys.argv[1:], "rounds_s": rounds}, f,
                      indent=1)


if __name__ == "__main__":
    sys.exit(main())
