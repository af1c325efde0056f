#!/usr/bin/env bash
# The runs of PLAN.md (this folder): 6 processes of the current code, 2 threads, one round each.
set -u
PY=/work/main/.venv/bin/python
OUT=/work/main/benchmarks/results/issue21/epyc/session12/threads2
cd /work/main
for i in $(seq 1 6); do
  [ -f $OUT/run_$i.json ] && continue
  PYTHONPATH=src $PY benchmarks/bench_train_e2e.py --threads 2 --rounds 1 --presets fp32,mxfp4 \
    --out $OUT/run_$i.json > $OUT/run_$i.log 2>&1
done
echo done > /tmp/run_s12t2.done
