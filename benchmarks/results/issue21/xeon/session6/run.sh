#!/usr/bin/env bash
# The runs of PLAN.md: 10 alternated pairs, before (worktree of cb806897) and after (/work/main).
set -u
PY=/work/main/.venv/bin/python
OUT=/work/main/benchmarks/results/issue21/xeon/session6
declare -A DIR=([before]=/tmp/wt_before [after]=/work/main)
for i in $(seq 1 10); do
  for w in before after; do
    [ -f $OUT/${w}_$i.json ] && continue
    (cd ${DIR[$w]} && PYTHONPATH=${DIR[$w]}/src $PY benchmarks/bench_train_step.py --quick \
      --threads 1 --models tiny-deep small w256 --presets nvfp4 mxfp4 --rounds 3 \
      --out $OUT/${w}_$i.json > $OUT/${w}_$i.log 2>&1)
  done
done
echo done > /tmp/run_s6.done
