"""Would ``torch.compile`` make the quantizer fast by fusing snip's PyTorch path? (issue 21)

The issue offers two ways to put a snip layer under ``torch.compile``: the numba kernels as
custom ops (what ``snip.nn.ops`` does), or the pure-PyTorch quantizer (``SNIP_FAST=0``'s path)
traced, so that Inductor fuses its dozen elementwise passes into generated C++ loops.  This
probe measures the second: for each preset and axis, ``torch.compile(fullgraph=True)`` of the
PyTorch path on one operand, checked bit for bit against the eager PyTorch path and the numba
kernel, and timed against both (median of ``--reps`` calls, 1 thread, after warm-up).

    PYTHONPATH=src python benchmarks/probe_compiled_quantizer.py
    PYTHONPATH=src python benchmarks/probe_compiled_quantizer.py --presets mxfp4 --shape 1024 64
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from snip.formats import fast
from snip.formats.quantize import _quantize

try:
    from benchmarks._util import cpu_info
except ImportError:  # run as a script from the benchmarks directory
    from _util import cpu_info


def median_us(fn, x: torch.Tensor, reps: int) -> float:
    for _ in range(3):
        fn(x)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def probe(preset: str, axis: int, shape: tuple[int, int], reps: int) -> dict:
    def torch_path(x: torch.Tensor) -> torch.Tensor:
        return _quantize(x, preset, axis, None, None)

    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    torch._dynamo.reset()
    row: dict = {"preset": preset, "axis": axis, "shape": list(shape)}
    with _fast(False):
        compiled = torch.compile(torch_path, fullgraph=True, dynamic=False)
        t = time.perf_counter()
        try:
            got = compiled(x)
        except Exception as e:  # noqa: BLE001 - a probe reports what fails
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            return row
        row["compile_s"] = time.perf_counter() - t
        want = torch_path(x)
        row["torch_us"] = median_us(torch_path, x, reps)
        row["compiled_us"] = median_us(compiled, x, reps)
    with _fast(True):
        numba_q = torch_path(x)
        row["numba_us"] = median_us(torch_path, x, reps)
    row["compiled_equals_torch"] = torch.equal(got.view(torch.int32), want.view(torch.int32))
    row["compiled_equals_numba"] = torch.equal(got.view(torch.int32), numba_q.view(torch.int32))
    return row


class _fast:
    """``SNIP_FAST`` on or off for the block (the path ``_quantize`` takes)."""

    def __init__(self, on: bool) -> None:
        self.on = on

    def __enter__(self) -> None:
        import os
        self.before = os.environ.get("SNIP_FAST")
        os.environ["SNIP_FAST"] = "1" if self.on else "0"

    def __exit__(self, *exc) -> None:
        import os
        if self.before is None:
            os.environ.pop("SNIP_FAST", None)
        else:
            os.environ["SNIP_FAST"] = self.before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", nargs="+", default=["mxfp4", "fp8_e4m3", "nvfp4"])
    ap.add_argument("--shape", nargs=2, type=int, default=[1024, 64])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if not fast.AVAILABLE:
        sys.exit("numba is not installed: nothing to compare against")
    info = cpu_info()
    print(f"CPU: {info['summary']}")
    rows = []
    for preset in args.presets:
        for axis in (-1, 0):
            row = probe(preset, axis, tuple(args.shape), args.reps)
            rows.append(row)
            if "error" in row:
                print(f"{preset:12s} axis {axis:2d}: compile failed: {row['error']}")
                continue
            print(f"{preset:12s} axis {axis:2d}: compiled {row['compiled_us']:8.1f} us, "
                  f"torch eager {row['torch_us']:8.1f} us, numba {row['numba_us']:7.1f} us; "
                  f"bits == torch: {row['compiled_equals_torch']}, "
                  f"== numba: {row['compiled_equals_numba']}; compile {row['compile_s']:.1f} s")
    if args.out:
        args.out.write_text(json.dumps({"command": " ".join(sys.argv), "cpu": info,
                                        "torch": torch.__version__, "rows": rows}, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
