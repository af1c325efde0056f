#!/usr/bin/env bash
# The runs of PLAN.md (6 runs of the current code at every model), then ../e2e_zen4/PLAN.md's
# (7 processes of session 17's e2e run.sh with that folder); resumable.
set -u
cd "$(dirname "$0")/../../../../../.."
OUT=benchmarks/results/issue21/epyc/session19/targets_zen4
for i in $(seq 1 6); do
  [ -f $OUT/run_$i.json ] && continue
  PYTHONPATH=src .venv/bin/python benchmarks/bench_train_step.py --quick --no-warm --auto \
    --threads 1 --models tiny-deep small small-deep medium w256 --rounds 5 \
    --out $OUT/run_$i.json.tmp > $OUT/run_$i.log 2>&1 && mv $OUT/run_$i.json.tmp $OUT/run_$i.json
done
OUT=benchmarks/results/issue21/epyc/session19/e2e_zen4 N=7 \
  bash benchmarks/results/issue21/epyc/session17/e2e_zen3/run.sh
echo done > /tmp/run_session19.done
