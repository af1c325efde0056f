#!/usr/bin/env bash
# The 6 processes of PLAN.md, one after another, in the repository root; resumable.  (OUT and
# N choose another folder and count: session 18's run.sh calls this with its own; THREADS and
# E2E_PRESETS another thread count and presets: session 20's.)
set -u
cd "$(dirname "$0")/../../../../../.."
OUT=${OUT:-benchmarks/results/issue21/epyc/session17/e2e_zen3}
for i in $(seq 1 "${N:-6}"); do
  [ -f $OUT/run_$i.json ] && continue
  PYTHONPATH=src .venv/bin/python benchmarks/bench_train_e2e.py --threads "${THREADS:-1}" \
    --rounds 1 --presets "${E2E_PRESETS:-fp32,mxfp4}" --out $OUT/run_$i.json.tmp > $OUT/run_$i.log 2>&1 \
    && mv $OUT/run_$i.json.tmp $OUT/run_$i.json
done
