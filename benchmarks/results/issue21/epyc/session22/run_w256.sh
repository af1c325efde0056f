#!/usr/bin/env bash
# Session 22's third runs (w256_t1/PLAN.md): 12 x bench_train_step.py --quick --no-warm --auto
# --threads 1 --models medium w256 --rounds 5, then the same at --threads 2 into w256_t2/,
# starting no new run after the plan's cutoff; resumable.
set -u
cd "$(dirname "$0")/../../../../.."
S=benchmarks/results/issue21/epyc/session22
for t in 1 2; do
  for i in $(seq 1 12); do
    OUT=$S/w256_t$t
    [ -f $OUT/run_$i.json ] && continue
    [ "$(date -u +%H%M)" -ge "${CUTOFF:-1350}" ] && break 2
    PYTHONPATH=src .venv/bin/python benchmarks/bench_train_step.py --quick --no-warm --auto \
      --threads $t --models medium w256 --rounds 5 \
      --out $OUT/run_$i.json.tmp > $OUT/run_$i.log 2>&1 && mv $OUT/run_$i.json.tmp $OUT/run_$i.json
  done
done
echo done > /tmp/run_session22_w256.done
