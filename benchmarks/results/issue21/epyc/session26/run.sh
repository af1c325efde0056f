#!/usr/bin/env bash
# Session 26's runs (t1_rep24/PLAN.md): 24 x bench_train_step.py --quick --no-warm --auto
# --threads 1 --models tiny-deep small small-deep --rounds 5, one after another, no new run
# starting at or after the plan's cutoff; resumable.
set -u
cd "$(dirname "$0")/../../../../.."
OUT=benchmarks/results/issue21/epyc/session26/t1_rep24
for i in $(seq 1 24); do
  [ -f $OUT/run_$i.json ] && continue
  [ "$(date -u +%H%M)" -ge "${CUTOFF:-2225}" ] && break
  PYTHONPATH=src .venv/bin/python benchmarks/bench_train_step.py --quick --no-warm --auto \
    --threads 1 --models tiny-deep small small-deep --rounds 5 \
    --out $OUT/run_$i.json.tmp > $OUT/run_$i.log 2>&1 && mv $OUT/run_$i.json.tmp $OUT/run_$i.json
done
echo done > /tmp/run_session26.done
