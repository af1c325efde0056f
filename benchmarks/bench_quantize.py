"""Quantization throughput on a 4096 x 4096 fp32 tensor, against peers measured in the same run.

    .venv/bin/python benchmarks/bench_quantize.py [--size 4096] [--repeats 7]

Rows: ``snip.quantize`` (fused fast path) for the main presets; torchao 0.18's reference
quantizers on the same input (``to_mx`` + ``to_dtype`` for MXFP4, ``NVFP4Tensor.to_nvfp4`` +
``dequantize`` for NVFP4); the ml_dtypes e2m1 round-trip cast (element only, no scaling); and a
plain ``copy_`` of the tensor as the memory-bandwidth roof.  Every figure is Melem/s of the best
of N runs; ratios are against the peer or the copy measured in this run.  The fast path is
checked to be bit-identical to the PyTorch reference path on this input before timing.
"""

from __future__ import annotations

import argparse
import os
import platform

import numpy as np
import torch

import snip
from snip.formats import fast
from snip.runtime import tune_malloc

try:
    from benchmarks._util import best_time, write_json
except ImportError:  # run as a script from the benchmarks directory
    from _util import best_time, write_json

PRESETS = ["fp8_e4m3", "fp8_e4m3_tile128", "mxfp8_e4m3", "mxfp4", "nvfp4", "fp4_e2m1_tile128"]


def torchao_rows(x: torch.Tensor):
    try:
        from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx
        from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor
    except ImportError:
        return {}

    def mx():
        s, d = to_mx(x, torch.float4_e2m1fn_x2, 32)
        return to_dtype(d, s, torch.float4_e2m1fn_x2, 32, torch.float32)

    def nv():
        return NVFP4Tensor.to_nvfp4(x).dequantize(torch.float32)

    return {"torchao mxfp4 (to_mx+to_dtype)": mx, "torchao nvfp4 (NVFP4Tensor)": nv}


def check_bit_identical(x: torch.Tensor) -> None:
    os.environ["SNIP_FAST"] = "0"
    ref = {p: snip.quantize(x, p) for p in PRESETS}
    os.environ["SNIP_FAST"] = "1"
    for p in PRESETS:
        assert torch.equal(snip.quantize(x, p), ref[p]), f"fast path differs from reference for {p}"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--no-mallopt", action="store_true", help="keep glibc's default allocator")
    args = ap.parse_args()
    tuned = False if args.no_mallopt else tune_malloc()
    x = torch.randn(args.size, args.size, generator=torch.Generator().manual_seed(0))
    n = x.numel()
    if fast.enabled():
        check_bit_identical(x)
    rows: dict[str, float] = {}
    y = torch.empty_like(x)
    rows["copy_ (bandwidth roof)"] = best_time(lambda: y.copy_(x), args.repeats)
    rows["clone (copy to a new tensor)"] = best_time(lambda: x.clone(), args.repeats)
    for p in PRESETS:
        rows[f"snip {p}"] = best_time(lambda p=p: snip.quantize(x, p), args.repeats)
    for name, fn in torchao_rows(x).items():
        rows[name] = best_time(fn, max(2, args.repeats // 2))
    import ml_dtypes

    xn = x.numpy()
    rows["ml_dtypes e2m1 round trip"] = best_time(
        lambda: xn.astype(ml_dtypes.float4_e2m1fn).astype(np.float32), max(2, args.repeats // 2)
    )

    melem = {k: n / v / 1e6 for k, v in rows.items()}
    copy = melem["copy_ (bandwidth roof)"]
    ao_mx = melem.get("torchao mxfp4 (to_mx+to_dtype)")
    ao_nv = melem.get("torchao nvfp4 (NVFP4Tensor)")
    print(f"{'row':<34} {'ms':>9} {'Melem/s':>9} {'x copy_':>8} {'x torchao':>9}")
    for k, v in rows.items():
        peer = ao_mx if "mxfp4" in k else ao_nv if "nvfp4" in k else None
        vs_peer = f"{melem[k] / peer:9.1f}" if peer and k.startswith("snip") else f"{'':>9}"
        print(f"{k:<34} {v * 1e3:9.1f} {melem[k]:9.0f} {melem[k] / copy:8.3f} {vs_peer}")
    summary = {
        "mxfp4_vs_torchao": melem["snip mxfp4"] / ao_mx if ao_mx else None,
        "nvfp4_vs_torchao": melem["snip nvfp4"] / ao_nv if ao_nv else None,
        "fp8_per_tensor_vs_copy": melem["snip fp8_e4m3"] / copy,
    }
    print("targets: mxfp4, nvfp4 >= 10x torchao; fp8 per-tensor >= 0.25x copy_")
    print({k: round(v, 2) if v else v for k, v in summary.items()})
    path = write_json(
        "bench_quantize.json",
        {
            "size": args.size,
            "torch": torch.__version__,
            "machine": platform.machine(),
            "threads": torch.get_num_threads(),
            "fast_path": fast.enabled(),
            "mallopt": tuned,
            "melem_per_s": melem,
            "summary": summary,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
