#!/usr/bin/env bash
# The processes of PLAN.md (up to 7), one after another, in the repository root; resumable.
set -u
cd "$(dirname "$0")/../../../../../.."
OUT=benchmarks/results/issue21/epyc/session18/e2e_zen3
for i in $(seq 1 7); do
  [ -f $OUT/run_$i.json ] && continue
  PYTHONPATH=src .venv/bin/python benchmarks/bench_train_e2e.py --threads 1 --rounds 1 \
    --presets fp32,mxfp4 --out $OUT/run_$i.json.tmp > $OUT/run_$i.log 2>&1 \
    && mv $OUT/run_$i.json.tmp $OUT/run_$i.json
done
