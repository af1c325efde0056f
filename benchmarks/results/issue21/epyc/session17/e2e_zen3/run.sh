#!/usr/bin/env bash
# The 6 processes of PLAN.md, one after another, in the repository root; resumable.
set -u
cd "$(dirname "$0")/../../../../../.."
OUT=benchmarks/results/issue21/epyc/session17/e2e_zen3
for i in $(seq 1 6); do
  [ -f $OUT/run_$i.json ] && continue
  PYTHONPATH=src .venv/bin/python benchmarks/bench_train_e2e.py --threads 1 --rounds 1 \
    --presets fp32,mxfp4 --out $OUT/run_$i.json.tmp > $OUT/run_$i.log 2>&1 \
    && mv $OUT/run_$i.json.tmp $OUT/run_$i.json
done
