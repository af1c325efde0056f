"""Which OpenMP runtime numba's parallel kernels run on in a snip process (RESULTS §7au).

numba's ``omp`` threading layer (``omppool``) is linked against ``libgomp.so.1.0.0`` (the
system's), torch against its own bundled ``libgomp.so.1``: both are mapped into a process that
uses snip.  This asks the dynamic linker where ``omppool``'s OpenMP calls (``GOMP_parallel``,
``omp_set_num_threads``) are bound: it reruns itself as a child with ``LD_DEBUG=bindings``,
the child importing snip (torch first, as ``snip.formats.fast`` does), running torch's and then
a numba kernel's parallel region at 2 threads and counting the process's threads after each
(numba itself starts a thread when it loads: a one-thread call comes first).
A second thread pool would show as one more thread after numba's region.

    PYTHONPATH=src python benchmarks/results/issue21/epyc/session21/openmp_runtime.py
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path


def child() -> None:
    import torch

    from snip.formats import fast, quantize  # noqa: F401 - (imports numba after torch)
    from snip.formats.spec import get_spec

    def count() -> int:
        return len(os.listdir("/proc/self/task"))

    torch.set_num_threads(2)
    threads = {"start": count()}
    quantize(torch.randn(8, 32), get_spec("mxfp4"))  # one thread: numba loaded, no region
    threads["after a one-thread numba call"] = count()
    x = torch.randn(4096, 4096)
    (x @ x).sum()
    threads["after torch's region"] = count()
    quantize(x, get_spec("mxfp4"))  # 16 Mi elements: a parallel numba region at 2 threads
    import numba
    threads["after numba's region"] = count()
    mapped = sorted({line.split()[-1] for line in open("/proc/self/maps") if "gomp" in line})
    print(json.dumps({"threads": threads, "numba_threading_layer": numba.threading_layer(),
                      "numba_threads": numba.get_num_threads(), "libgomp_mapped": mapped}))


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, LD_DEBUG="bindings", LD_DEBUG_OUTPUT=f"{d}/ld")
        out = subprocess.run([sys.executable, __file__, "--child"], env=env, check=True,
                             capture_output=True, text=True).stdout
        found = json.loads(out.strip().splitlines()[-1])
        bound = {}
        for f in Path(d).iterdir():
            for line in f.read_text(errors="replace").splitlines():
                m = re.search(r"binding file (\S*omppool\S*) \[0\] to (\S+) \[0\]: "
                              r"normal symbol `(\w+)'", line)
                if m and m.group(3) in ("GOMP_parallel", "omp_set_num_threads"):
                    bound[m.group(3)] = m.group(2)
    found["omppool_symbols_bound_to"] = bound
    print(json.dumps(found, indent=1))


if __name__ == "__main__":
    child() if sys.argv[1:] == ["--child"] else main()
