#!/usr/bin/env bash
# The runs of PLAN.md: 6 runs of the fixed code at widths 64 and 128, one after another; resumable.
set -u
cd "$(dirname "$0")/../../../../../.."
OUT=benchmarks/results/issue21/epyc/session19/bf16_cols
for i in $(seq 1 6); do
  [ -f $OUT/run_$i.json ] && continue
  PYTHONPATH=src .venv/bin/python benchmarks/bench_train_step.py --quick --no-warm --auto \
    --threads 1 --models tiny-deep small small-deep --rounds 5 \
    --out $OUT/run_$i.json.tmp > $OUT/run_$i.log 2>&1 && mv $OUT/run_$i.json.tmp $OUT/run_$i.json
done
echo done > /tmp/run_bf16_cols.done
