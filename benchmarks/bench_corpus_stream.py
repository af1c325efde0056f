"""Tokenizing a large text corpus: peak memory and throughput of the streamed cache (issue 23).

Builds a text file of ``--mb`` megabytes from the standard library's sources (repeated), then
tokenizes it into a fresh cache with `snip.data.corpus.tokenize_corpus` (the path `snip train
--data.path FILE` takes) and reports the peak resident memory above the process's baseline
(after imports, before tokenizing) and the rate.  The memory must not grow with the corpus:
run it at two sizes to see that.

    PYTHONPATH=src python benchmarks/bench_corpus_stream.py --mb 1000 --json out.json
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sysconfig
import tempfile
import time
from pathlib import Path

from snip.data import corpus
from snip.data.tokenizer import ByteTokenizer


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def make_corpus(path: Path, mb: int) -> int:
    root = Path(sysconfig.get_paths()["stdlib"])
    data = "".join(p.read_text(errors="replace") for p in sorted(root.glob("*.py"))).encode()
    n = 0
    with open(path, "wb") as f:
        while n < mb * 10**6:
            f.write(data)
            n += len(data)
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=1000, help="corpus size in MB (default 1000)")
    ap.add_argument("--json", type=Path, help="write the result here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "corpus.txt"
        size = make_corpus(text, args.mb)
        docs = corpus.text_documents(text)
        base = _peak_mb()
        t0 = time.perf_counter()
        train, val = corpus.tokenize_corpus(docs, ByteTokenizer(), cache_dir=Path(tmp) / "c",
                                            name="text")
        took = time.perf_counter() - t0
        peak = _peak_mb()
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor())
    flags = sorted({f for line in open("/proc/cpuinfo") if line.startswith("flags")
                    for f in line.split()[2:] if f.startswith(("avx", "amx", "fma"))})
    out = {"corpus_bytes": size, "tokens": len(train) + len(val), "seconds": round(took, 2),
           "mb_per_s": round(size / took / 1e6, 1), "baseline_rss_mb": round(base, 1),
           "peak_rss_mb": round(peak, 1), "peak_above_baseline_mb": round(peak - base, 1),
           "cpu": cpu, "cpu_flags": flags}
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
