"""NVFP4 against an independent numpy transcription of the NVIDIA / Transformer Engine scale chain
(research/peers.md section 4 item 5), on golden vectors including zero and underflowing blocks."""

import ml_dtypes
import numpy as np
import torch

from snip.formats import encode, quantize

F32 = np.float32
FP4 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def fp4_rne(v: np.ndarray) -> np.ndarray:
    """Round onto E2M1 with ties to the even code (codes 0..7 -> even index), saturating at 6."""
    a = np.minimum(np.abs(v.astype(np.float64)), 6.0)
    lo = np.searchsorted(FP4, a, side="right") - 1
    hi = np.minimum(lo + 1, 7)
    dlo, dhi = a - FP4[lo], FP4[hi] - a
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0))
    return (np.sign(v) * np.where(pick_hi, FP4[hi], FP4[lo])).astype(F32)


def nvfp4_reference(x: np.ndarray) -> np.ndarray:
    """One fp32 operation at a time, as the chain is written."""
    x = x.astype(F32)
    amax = F32(np.abs(x).max())
    s_enc = F32(min(F32(F32(448.0 * 6.0) / amax), np.finfo(F32).max)) if amax > 0 else F32(1.0)
    if s_enc == 0:
        s_enc = F32(1.0)
    blocks = x.reshape(-1, 16)
    out = np.empty_like(blocks)
    sixth = F32(F32(1.0) / F32(6.0))
    for i, b in enumerate(blocks):
        bmax = F32(np.abs(b).max())
        s_dec = np.minimum(F32(bmax * F32(s_enc * sixth)), F32(448.0))
        s_dec = F32(np.array(s_dec, F32).astype(ml_dtypes.float8_e4m3fn).astype(F32))
        dec = F32(s_dec * F32(F32(1.0) / s_enc))
        enc = F32(min(F32(F32(1.0) / dec), np.finfo(F32).max)) if dec != 0 else np.finfo(F32).max
        with np.errstate(over="ignore"):
            q = fp4_rne((b * enc).astype(F32))
        out[i] = (q * dec).astype(F32)
    return out.reshape(x.shape)


def golden_inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    under = np.concatenate([rng.standard_normal(16) * 1e4, rng.standard_normal(16) * 1e-9])
    ties = (rng.integers(-24, 25, 64) / 4).astype(F32)
    return [
        rng.standard_normal(256).astype(F32),
        (rng.standard_normal(256) * np.repeat(10.0 ** rng.uniform(-6, 6, 16), 16)).astype(F32),
        np.zeros(64, F32),  # all-zero tensor
        np.concatenate([np.zeros(16), rng.standard_normal(48)]).astype(F32),  # one zero block
        under.astype(F32),  # block scale underflows to 0
        ties,
        np.full(32, 3.0000002, F32),
    ]


def test_nvfp4_equals_transcription():
    for x in golden_inputs():
        want = nvfp4_reference(x)
        got = quantize(torch.from_numpy(x.copy()), "nvfp4").numpy()
        np.testing.assert_array_equal(got, want)
        assert not np.isnan(got).any()


def test_underflowing_block_decodes_to_zero_without_nan():
    x = torch.from_numpy(golden_inputs()[4])
    q = encode(x, "nvfp4")
    assert q.scales.view(torch.uint8)[1] == 0  # the tiny block's e4m3 scale underflowed
    y = q.dequantize()
    assert torch.equal(y[16:], torch.zeros(16)) and torch.equal(y, quantize(x, "nvfp4"))


def test_nvfp4_2d_weight_blocks_transpose_consistent():
    from snip.formats import get_spec

    w = torch.randn(48, 80)
    spec = get_spec("nvfp4").for_weight()
    assert torch.equal(quantize(w, spec).T, quantize(w.T.contiguous(), spec))
