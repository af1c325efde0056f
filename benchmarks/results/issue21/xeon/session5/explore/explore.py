"""Exploratory probes behind session5 (scratch, kept with what they printed: README.md here).

    cd benchmarks/results/issue21/xeon/session5/explore
    PYTHONPATH=../../../../../../src python explore.py bf16 small 2 7
    PYTHONPATH=../../../../../../src python explore.py threads small 2 7 mxfp4
    PYTHONPATH=../../../../../../src python explore.py choices small 2 12 mxfp4

``bf16``: the ``bf16`` preset's step with ``round_bf16`` as is, as torch casts, and forced onto
all threads; ``threads``: a preset's step with the adaptive thread choice, every call of 2^14
elements or more on all threads, and every call under 2^20 on one thread.  Both toggle the
variant per step in one process against a plain fp32 step (medians of 3 steps per round) and
print ratios to fp32 and paired differences with +- 2.45 standard errors over the rounds.
``choices``: after N steps, each middle-size kind of call's probes and choice.
"""

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[6]))
from benchmarks.bench_train_step import QUICK_SHAPES, Arm  # noqa: E402

from snip.formats import fast  # noqa: E402


def _torch_cast(x: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    y = x.to(torch.bfloat16)
    return y if dtype == torch.bfloat16 else y.float()


def _parallel_bf16(x: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    fast._follow_torch_threads(None)  # all threads
    x = x.contiguous()
    out = fast.empty_like(x, dtype)
    os_ = fast._np(out)
    fast._bf16_rows(fast._np(x).view(fast.np.uint32),
                    os_ if dtype == torch.bfloat16 else os_.view(fast.np.uint32), fast._CHUNK * 4)
    return out


def _threads_setter(name: str) -> None:
    fast._ADAPT, fast._PARALLEL_MIN = {"real": (True, 1 << 20), "par16k": (False, 1 << 14),
                                       "serial": (False, 1 << 40)}[name]


def main() -> None:
    mode, model, threads, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    preset = sys.argv[5] if len(sys.argv) > 5 else "bf16"
    torch.set_num_threads(threads)
    b, t = QUICK_SHAPES[model]
    g = torch.Generator().manual_seed(0)
    batch = (torch.randint(256, (b, t), generator=g), torch.randint(256, (b, t), generator=g))
    q = Arm(model, preset, batch)
    if mode == "choices":
        for _ in range(n):
            q.step()
        for (spec, shape, axis, sr, _), (_, ch) in fast._PLANS.items():
            if ch.calls and fast._ADAPT_MIN <= torch.Size(shape).numel() < fast._PARALLEL_MIN:
                one, every = ch.times
                print(f"{spec.name:8s} {tuple(shape)!s:14s} ax{axis} sr{int(sr)} calls "
                      f"{ch.calls:4d} parallel={ch.parallel} one_us={[round(x * 1e6) for x in one]}"
                      f" all_us={[round(x * 1e6) for x in every]}")
        return
    if mode == "bf16":
        real = fast.round_bf16
        fns = {"real": real, "torchcast": _torch_cast, "parallel": _parallel_bf16}

        def use(k: str) -> None:
            fast.round_bf16 = fns[k]
        names = list(fns)
    else:
        use, names = _threads_setter, ["real", "par16k", "serial"]
    plain = Arm(model, "fp32", batch)
    for _ in range(3):
        plain.step()
        q.step()
    for k in names:
        use(k)
        q.step()
    res: dict[str, list[float]] = {k: [] for k in ["fp32", *names]}
    for _ in range(n):
        res["fp32"].append(statistics.median(plain.step()[0] for _ in range(3)))
        for k in names:
            use(k)
            res[k].append(statistics.median(q.step()[0] for _ in range(3)))
    use("real")
    f = statistics.median(res["fp32"])
    print(model, threads, preset, f"fp32 {f * 1e3:.1f} ms", " ".join(
        f"{k}: {statistics.median(v) / f:.3f}" for k, v in res.items() if k != "fp32"))
    for k in names[1:]:
        d = [(a - r) / f for a, r in zip(res[k], res["real"], strict=True)]
        se = statistics.stdev(d) / len(d) ** 0.5
        print(f"   {k}-real: {statistics.mean(d):+.3f} +- {2.45 * se:.3f} (n={len(d)})")


if __name__ == "__main__":
    main()
