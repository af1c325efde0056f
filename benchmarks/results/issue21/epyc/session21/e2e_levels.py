"""The pre-registered analysis of session 21's end-to-end runs (``PLAN.md`` part 5): for each
preset ``P`` a process ran (``args.presets``), the whole-run wall-time ratio ``train_P /
loop_P`` (issue 21's target: ``snip train`` within 1.2x of the minimal loop on the same model
and batches) and the control ``loop_P / loop_plain``; mean and 95 % t-interval over the
``run_<i>.json`` processes of the folder, and for each target ratio **inside** (upper end below
1.2), **outside** (lower end above) or **unresolved** (session 12's ``e2e_paired.interval`` and
``verdict``).

    PYTHONPATH=src python benchmarks/results/issue21/epyc/session21/e2e_levels.py DIR
"""

import importlib.util
import json
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "e2e_paired", Path(__file__).parents[1] / "session12" / "e2e_paired.py")
e2e = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(e2e)


def main() -> None:
    runs = [json.loads(p.read_text()) for p in sorted(Path(sys.argv[1]).glob("run_*.json"))]
    presets = runs[0]["args"]["presets"].split(",")
    assert all(r["args"]["presets"].split(",") == presets for r in runs)
    print(f"n = {len(runs)} processes; threads {runs[0]['args']['threads']}; whole-run "
          f"wall-time ratios, mean [95% t-interval]")
    for p in presets:
        for name, (a, b), target in ((f"train_{p} / loop_{p}", (f"train_{p}", f"loop_{p}"), True),
                                     (f"loop_{p} / loop_plain (control)",
                                      (f"loop_{p}", "loop_plain"), False)):
            m, lo, hi = e2e.interval([r["seconds"][a][0] / r["seconds"][b][0] for r in runs])
            line = f"{name:40s} {m:.3f} [{lo:.3f}, {hi:.3f}]"
            if target:
                line += f"  {e2e.verdict(lo, hi)} ({e2e.TARGET})"
            print(line)


if __name__ == "__main__":
    main()
