#!/usr/bin/env bash
# The runs of PLAN.md: 6 alternated pairs of `bench_train_e2e.py` processes, before (worktree
# of 8946ae2f) and after (/work/main), one round each, 1 thread.
set -u
PY=/work/main/.venv/bin/python
OUT=/work/main/benchmarks/results/issue21/epyc/session12
declare -A DIR=([before]=/work/wt_before [after]=/work/main)
for w in before after; do  # each worktree's numba cache, before anything is timed
  (cd ${DIR[$w]} && PYTHONPATH=${DIR[$w]}/src $PY -m snip.formats.warm > /dev/null 2>&1)
done
for i in $(seq 1 6); do
  for w in before after; do
    [ -f $OUT/${w}_$i.json ] && continue
    (cd ${DIR[$w]} && PYTHONPATH=${DIR[$w]}/src $PY benchmarks/bench_train_e2e.py --threads 1 \
      --rounds 1 --presets fp32,mxfp4 --out $OUT/${w}_$i.json > $OUT/${w}_$i.log 2>&1)
  done
done
echo done > /tmp/run_s12.done
