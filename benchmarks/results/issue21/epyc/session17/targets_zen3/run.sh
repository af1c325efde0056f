#!/usr/bin/env bash
# The runs of PLAN.md: 6 runs of the current code at every model, one after another.
set -u
cd "$(dirname "$0")/../../../../../.."
OUT=benchmarks/results/issue21/epyc/session17/targets_zen3
for i in $(seq 1 6); do
  [ -f $OUT/run_$i.json ] && continue
  PYTHONPATH=src .venv/bin/python benchmarks/bench_train_step.py --quick --no-warm --no-autocast \
    --threads 1 --models tiny-deep small small-deep medium w256 --rounds 5 \
    --out $OUT/run_$i.json.tmp > $OUT/run_$i.log 2>&1 && mv $OUT/run_$i.json.tmp $OUT/run_$i.json
done
echo done > /tmp/run_targets_zen3.done
