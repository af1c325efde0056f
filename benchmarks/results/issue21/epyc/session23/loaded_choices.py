"""Each kind of quantizer call's thread choice and probe medians after some 2-thread training
steps of one model and preset (descriptive; PLAN.md part 2's loaded check runs it under a busy
loop on one core, in each tree):

    (python3 -c "while True: pass" &); cd TREE && PYTHONPATH=src python \\
        /work/main/benchmarks/results/issue21/epyc/session23/loaded_choices.py small nvfp4 30
"""

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path.cwd() / "benchmarks"))  # the tree's bench_train_step
import bench_train_step as bench  # noqa: E402
from snip.formats import fast  # noqa: E402


def main() -> None:
    model, preset, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(2)
    b, t = (8, 128) if model == "tiny-deep" else (4, 256)
    tok = torch.randint(bench.model_config(model).vocab_size, (b, t + 1),
                        generator=torch.Generator().manual_seed(1))
    arm = bench.Arm(model, preset, (tok[:, :-1].contiguous(), tok[:, 1:].contiguous()))
    for _ in range(steps):
        arm.step()
    print(f"{fast.__file__}: {model} {preset}, {steps} steps at 2 threads")
    for key, call in fast._PLANS.items():
        one, every = call.choice.times
        if one and every:
            m1, mp = statistics.median(one) * 1e6, statistics.median(every) * 1e6
            print(f"{str(tuple(key[1])):12s} axis {key[2]:2d} sr {int(key[3])} all threads "
                  f"{call.choice.parallel!s:5s} one-thread median {m1:8.1f} us, all threads "
                  f"median {mp:8.1f} us, max {max(every) * 1e6:8.1f} us")


if __name__ == "__main__":
    main()
