"""``python -m snip.formats.warm`` (run by ``make setup``) must reach every parallel kernel of
:mod:`snip.formats.fast` (directly, or through the compiled caller that alone calls it), and
every one-thread twin, with every input and output dtype a run uses: a kernel it misses is
compiled (tens of seconds) by the first training process that needs it."""

import numpy as np
import pytest

from snip.formats import fast, warm

pytestmark = pytest.mark.skipif("not fast.enabled()",
                                reason="fast path off (numba not installed or SNIP_FAST=0)")

FUSED = ("_fused_rows", "_fused_cols", "_fused_short_rows", "_fused_tiles")
# parallel kernels that only compiled callers call (NVFP4's first passes), and those callers:
# warming a caller compiles the kernels it calls for the types it passes
INNER = {"_block_max_bits": "_rows_nvfp4", "_tile_max_bits": "_tiles_nvfp4"}


def test_warm_reaches_every_parallel_kernel_and_twin_with_each_dtype(monkeypatch) -> None:
    """Every parallel kernel and every one-thread twin (``<name>_1t``, what one-thread calls
    run): the warm-up makes each call with the twins off and on."""
    kernels = {name: v for name, v in vars(fast).items()
               if hasattr(v, "py_func") and (v.targetoptions.get("parallel")
                                             or name in INNER.values() or name.endswith("_1t"))}
    twins = {f + "_1t" for f in FUSED} | {c + "_1t" for c in INNER.values()}
    assert set(FUSED) <= set(kernels) and set(INNER) <= set(kernels) and twins <= set(kernels)
    for name in INNER:  # (a wrapper from Python would not see their calls)
        del kernels[name]
    seen: set[tuple[str, str, str]] = set()
    for name, real in kernels.items():
        def wrapper(*args, _name=name, _real=real):
            arrays = [a for a in args if isinstance(a, np.ndarray)]
            seen.add((_name, str(arrays[0].dtype), str(arrays[1].dtype) if len(arrays) > 1
                      else ""))
            if _name.removesuffix("_1t") in ("_fused_rows", "_rows_nvfp4"):  # kt: block size
                seen.add((_name, "kt", str(len(args[5]))))
            return _real(*args)
        monkeypatch.setattr(fast, name, wrapper)
    fast._PLANS.clear()  # the plans bind the kernels when made
    assert warm.warm() > 0
    fast._PLANS.clear()
    called = {s[0] for s in seen}
    assert called == set(kernels), f"warm misses {set(kernels) - called}"
    for twin in ("", "_1t"):
        for name in ("_fused_rows", "_fused_cols", "_fused_short_rows",  # fp32 / bf16 (uint16)
                     "_rows_nvfp4"):
            for io in (("float32", "float32"), ("float32", "uint16"), ("uint16", "uint16")):
                if (name + twin, io[1]) == ("_fused_cols_1t", "uint16"):
                    continue  # (bf16 column outputs run the parallel build: test_fast_twins)
                assert (name + twin, *io) in seen, (name + twin, io)
        # (16, 32) or none; NVFP4's whole blocks of 16 reach _fused_rows through _rows_nvfp4
        assert {("_fused_rows" + twin, "kt", n) for n in ("0", "32")} <= seen
        assert ("_rows_nvfp4" + twin, "kt", "16") in seen
        assert {("_bf16_rows" + twin, "uint32", io) for io in ("uint16", "uint32")} <= seen


def test_parts_run_every_call_once_and_two_parts_split_by_input_dtype() -> None:
    """``--jobs``: every call runs in exactly one part; with two parts each input dtype is in
    one part only, so no kernel signature (they follow the dtypes) is compiled twice."""
    all_calls = list(warm.calls())
    for parts in (1, 2, 3, 4):
        owners = [warm.part_of(c[4], c[5], parts) for c in all_calls]
        assert set(owners) == set(range(parts))
    two = {(c[4], warm.part_of(c[4], c[5], 2)) for c in all_calls}
    assert len({dt for dt, _ in two}) == len(two) == 2


def test_locked_saves_make_numba_cache_saves_exclusive(tmp_path, monkeypatch) -> None:
    """A save waits while another holder has the lock beside the cache's index, then lands."""
    import fcntl
    import threading

    from numba.core import caching

    monkeypatch.setattr(caching.IndexDataCacheFile, "save", caching.IndexDataCacheFile.save)
    assert warm._locked_saves()
    cache = caching.IndexDataCacheFile(str(tmp_path), "f-1.py311", (0.0, 0))
    with open(tmp_path / ".snip-warm.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        saver = threading.Thread(target=cache.save, args=(("sig", "magic"), b"payload"),
                                 daemon=True)  # (a failing test must not hang the process)
        saver.start()
        saver.join(0.3)
        assert saver.is_alive()  # blocked on the lock
        assert cache.load(("sig", "magic")) is None
        fcntl.flock(held, fcntl.LOCK_UN)
        saver.join(10)
    assert not saver.is_alive()
    assert cache.load(("sig", "magic")) == b"payload"
    # a second call (warm_parallel run twice in one process) must not wrap the save again:
    # nested, it would open the lock file twice and wait on itself
    assert warm._locked_saves()
    again = threading.Thread(target=cache.save, args=(("sig2", "magic"), b"two"), daemon=True)
    again.start()
    again.join(10)
    assert not again.is_alive()
    assert cache.load(("sig2", "magic")) == b"two"


def test_jobs_must_be_positive(capsys) -> None:
    with pytest.raises(SystemExit):
        warm.main(["--jobs", "0"])
    assert "--jobs must be at least 1" in capsys.readouterr().err


@pytest.mark.slow
def test_parallel_warm_fills_a_cache_that_a_later_process_only_loads(tmp_path) -> None:
    """``--jobs 2`` on an empty cache (two minutes on two cores): afterwards a fresh process
    making every call compiles nothing, and no two entries share a data file."""
    import os
    import pickle
    import subprocess
    import sys

    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    subprocess.run([sys.executable, "-m", "snip.formats.warm", "--jobs", "2"], env=env,
                   check=True, capture_output=True)
    code = ("from snip.formats import fast, warm; warm.warm(); print(sum(sum(v.stats."
            "cache_misses.values()) for v in vars(fast).values() if hasattr(v, 'stats') and "
            "v._cache.__class__.__name__ == 'FunctionCache'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True)
    assert out.stdout.strip() == "0"
    for index in tmp_path.rglob("*.nbi"):
        with open(index, "rb") as f:
            pickle.load(f)  # numba's version
            _, entries = pickle.loads(f.read())
        names = list(entries.values())
        assert len(set(names)) == len(names)
        assert all((index.parent / n).exists() for n in names)
