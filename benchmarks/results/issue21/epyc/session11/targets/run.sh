#!/usr/bin/env bash
# The runs of PLAN.md: 6 runs of the current code at the width 128 and 256 models.
set -u
cd /work/main
OUT=/work/main/benchmarks/results/issue21/epyc/session11/targets
for i in $(seq 1 6); do
  [ -f $OUT/run_$i.json ] && continue
  PYTHONPATH=src .venv/bin/python benchmarks/bench_train_step.py --quick --no-warm --threads 1 \
    --models small small-deep medium w256 --rounds 5 --out $OUT/run_$i.json > $OUT/run_$i.log 2>&1
done
echo done > /tmp/run_targets.done
