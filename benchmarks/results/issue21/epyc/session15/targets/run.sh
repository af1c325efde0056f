#!/usr/bin/env bash
# The runs of PLAN.md: 6 runs of the current code at the width 128 and 256 models.
# Usage (repository root): bash benchmarks/results/issue21/epyc/session15/targets/run.sh
set -u
out=$PWD/benchmarks/results/issue21/epyc/session15/targets
for i in $(seq 1 6); do
  [ -f "$out/run_$i.json" ] && continue
  PYTHONPATH=src .venv/bin/python benchmarks/bench_train_step.py --quick --no-warm \
    --no-autocast --threads 1 --models small small-deep medium w256 --rounds 5 \
    --out "$out/run_$i.json" > "$out/run_$i.log" 2>&1
done
