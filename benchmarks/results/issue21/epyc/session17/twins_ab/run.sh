#!/usr/bin/env bash
# The 6 processes of PLAN.md, one after another, in the repository root (the code of the twins
# commit or later with the same kernels); resumable.  (OUT chooses another folder: session 18's
# run.sh calls this with its own.)
set -u
cd "$(dirname "$0")/../../../../../.."
AB=benchmarks/results/issue21/epyc/session17/twins_ab/ab.py
OUT=${OUT:-benchmarks/results/issue21/epyc/session17/twins_ab}
for i in $(seq 1 6); do
  [ -f $OUT/proc_$i.json ] && continue
  PYTHONPATH=src .venv/bin/python $AB $OUT/proc_$i.json > $OUT/proc_$i.log 2>&1
done
