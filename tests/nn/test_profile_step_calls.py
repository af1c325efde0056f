"""benchmarks/profile_step_calls.py times the quantizer calls a whole training step makes,
whatever keywords the layer passes them, and puts the real quantizer back."""

import inspect

import torch

import snip.nn.gemm as gemm
from _benchmarks import load
from snip.formats import fast
from snip.formats.rounding import Rounding
from snip.formats.spec import get_spec

script = load("profile_step_calls", "profile_step_calls_script")


def test_calls_records_every_kind_of_call_of_a_step_and_restores_the_quantizer() -> None:
    """One round of ``tiny-deep`` at 128 tokens with NVFP4 (its calls pass ``activation=``):
    every kind of call is timed in the step and alone, its kernel too, and the patched functions
    go back."""
    rows = script.calls("tiny-deep", "nvfp4", tokens=128, rounds=1)
    assert rows and all(r["spec"] == "nvfp4" and r["alone_us"] > 0 for r in rows)
    assert {r["axis"] for r in rows} == {-1, 0}  # forward's rows and wgrad's columns
    # every call's kernel is timed (NVFP4's rows enter _rows_nvfp4, its columns _fused_cols)
    assert all(r["kernel_in_step_us"] > 0 for r in rows)
    assert gemm.quantize_operand is script._REAL
    for name in script._ENTRY_KERNELS:
        assert getattr(fast, name).__name__ == name
        assert getattr(fast, name + "_1t").__name__ == name + "_1t"
    arm, made = script.Arm("tiny-deep", "nvfp4", script._batch("tiny-deep", 128)), []

    def count(*a, **k):
        made.append(a[1].name)
        return script._REAL(*a, **k)
    arm.step()
    gemm.quantize_operand = count
    try:
        arm.step()
    finally:
        gemm.quantize_operand = script._REAL
    assert sum(r["per_step"] for r in rows) == len(made)


def test_split_reads_cpu_time_and_with_wall_the_wall_clock(monkeypatch) -> None:
    """Part 1 takes each step's CPU seconds, or its wall seconds with ``wall`` (more than one
    thread): ``Arm.step`` returns both, here fixed, so the medians are exact.  The *copy*
    steps run with :func:`copy_operand` in the quantizer's place, once a round."""
    seen = []

    def step(self):
        seen.append(gemm.quantize_operand)
        return 0.25, 0.5
    monkeypatch.setattr(script.Arm, "step", step)
    for wall, ms in ((False, 500.0), (True, 250.0)):
        sp = script.split("tiny-deep", "mxfp4", tokens=128, rounds=1, wall=wall)
        assert {k: sp[k] for k in script._MODES} == dict.fromkeys(script._MODES, ms)
    assert seen.count(script.copy_operand) == 2 * (1 + 2)  # two splits, 1 + 2 warm-up rounds
    assert gemm.quantize_operand is script._REAL


def test_copy_operand_is_a_fresh_copy_in_the_dtype_the_real_call_returns() -> None:
    """The *copy* step's stand-in writes a new contiguous tensor of the input's values, fp32 or
    (for a bf16 GEMM's operand) bf16 as the real call would return, from the real call's
    allocator; an identity spec's operand is the input itself, as the real call gives it."""
    # a drop-in stand-in: quantize_operand's parameters, in its order
    assert list(inspect.signature(script.copy_operand).parameters) == list(
        script._SIGNATURE.parameters)
    x = torch.randn(64, 32).t()  # (non-contiguous)
    spec = get_spec("mxfp4")
    for bf16 in (False, True):
        real = script._REAL(x, spec, -1, Rounding.RNE, 0, bf16=bf16)
        out = script.copy_operand(x, spec, -1, Rounding.RNE, 0, bf16=bf16)
        assert out.dtype == real.dtype and out.is_contiguous()
        assert out.data_ptr() != x.data_ptr()
        assert torch.equal(out, x.to(out.dtype))
    # a large output comes from snip's buffer cache, as the real call's does: its memory goes
    # back to the cache when the tensor dies, and the next copy of that size takes it again
    big = torch.randn(1024, 384)
    fast.release_buffers()  # (no idle buffers from earlier tests: the cache's limit is far)
    first = script.copy_operand(big, spec, -1, Rounding.RNE, 0)
    del first
    assert fast._buffers.idle_bytes == big.nbytes
    again = script.copy_operand(big, spec, -1, Rounding.RNE, 0)
    assert fast._buffers.idle_bytes == 0 and torch.equal(again, big)
    ident = get_spec("fp32")
    assert script.copy_operand(x, ident, 0, Rounding.RNE, 0) is x
