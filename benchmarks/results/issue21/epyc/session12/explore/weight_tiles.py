"""Scratch (session 12, descriptive): a weight operand's planned call alone (RNE, 2-D tiles where
the preset has them), and for `nvfp4` its three pieces: the tile maxima pass, the tensor scale
call and the rounding pass; median of 2000 calls, 1 thread, microseconds.

    PYTHONPATH=src python benchmarks/results/issue21/epyc/session12/explore/weight_tiles.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from snip.formats import Rounding, fast, get_spec
from snip.formats.spec import _tiled

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ns_per_element import median_s  # noqa: E402


def us(f) -> float:
    return median_s(f, 2000) * 1e6


def nvfp4_pieces(w: torch.Tensor, sp) -> str:
    """The tile maxima pass, the tensor scale call and the rounding pass, each alone."""
    r, c = w.shape
    k = sp.block
    xs, os_ = fast._np(w), fast._np(torch.empty_like(w))
    bmax = np.empty(-(-r // k) * -(-c // k), np.int32)
    line = f" tile_max {us(lambda: fast._tile_max_bits(xs, r, c, k, bmax)):6.1f}"
    amax = fast._tile_max_bits(xs, r, c, k, bmax)
    line += f" tscale {us(lambda: fast._nvfp4_tensor_scale(amax, np.float32(6.0))):5.1f}"
    sfmt, pow2, emax_elem, maxn = fast._scale_params(sp)
    mul, t_dec = fast._nvfp4_tensor_scale(amax, maxn)
    fm = sp.element
    args = (r, c, k, bmax, sfmt, pow2, emax_elem, maxn, mul, t_dec, fm.mbits, fm.emin, fm.emax,
            np.float32(fm.max_normal))
    return line + f" tiles {us(lambda: fast._fused_tiles(xs, os_, *args)):6.1f}"


def main() -> None:
    torch.set_num_threads(1)
    for name in ("nvfp4", "fp4_e2m1_tile128", "fp8_e4m3_tile128", "mxfp4"):
        spec = get_spec(name)
        for shape in ((64, 64), (192, 64), (128, 128), (344, 128)):
            w = torch.randn(*shape)
            sp = _tiled(spec) if spec.weight_2d else spec
            call = fast.planned(w, sp, -1, Rounding.RNE, torch.float32)
            line = f"{name:18s} {str(shape):11s} planned {us(lambda w=w, c=call: c(w, None)):6.1f}"
            print(line + (nvfp4_pieces(w, sp) if name == "nvfp4" else ""), flush=True)


if __name__ == "__main__":
    main()
