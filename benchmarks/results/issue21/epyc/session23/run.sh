#!/usr/bin/env bash
# PLAN.md: 10 processes of bench_parallel_min.py at 2 threads, one after another; resumable (a
# finished run_<i>.json is kept). From the repository root:
#   bash benchmarks/results/issue21/epyc/session23/run.sh
set -u
OUT=benchmarks/results/issue21/epyc/session23/parallel_t2
mkdir -p $OUT
for i in $(seq 1 "${N:-10}"); do
  [ -f $OUT/run_$i.json ] && continue
  PYTHONPATH=src .venv/bin/python benchmarks/bench_parallel_min.py \
    --cases tiny-deep:8x128 small:4x256 --presets mxfp4 nvfp4 mxfp4@auto nvfp4@auto \
    --settings adaptive 16384 --rounds 20 --warmup 3 --out $OUT/run_$i.json.tmp \
    > $OUT/run_$i.log 2>&1 && mv $OUT/run_$i.json.tmp $OUT/run_$i.json
done
echo done > /tmp/run_session23.done
