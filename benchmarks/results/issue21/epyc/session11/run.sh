#!/usr/bin/env bash
# The runs of PLAN.md: 20 alternated pairs, before (worktree of 267086d4) and after (/work/main).
set -u
PY=/work/main/.venv/bin/python
OUT=/work/main/benchmarks/results/issue21/epyc/session11
declare -A DIR=([before]=/work/wt_before [after]=/work/main)
for i in $(seq 1 20); do
  for w in before after; do
    [ -f $OUT/${w}_$i.json ] && continue
    (cd ${DIR[$w]} && PYTHONPATH=${DIR[$w]}/src $PY benchmarks/bench_train_step.py --quick \
      --no-warm --threads 1 --models tiny-deep --presets bf16 fp8_e4m3 mxfp8_e4m3 mxfp4 nvfp4 \
      fp4_e2m1_tensor --rounds 5 --out $OUT/${w}_$i.json > $OUT/${w}_$i.log 2>&1)
  done
done
echo done > /tmp/run_s11.done
