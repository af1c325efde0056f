#!/usr/bin/env bash
# The 6 processes of PLAN.md, one after another, in the repository root; resumable.
set -u
cd "$(dirname "$0")/../../../../../.."
AB=benchmarks/results/issue21/epyc/session17/twins_ab/ab.py
OUT=benchmarks/results/issue21/epyc/session18/twins_ab
for i in $(seq 1 6); do
  [ -f $OUT/proc_$i.json ] && continue
  PYTHONPATH=src .venv/bin/python $AB $OUT/proc_$i.json > $OUT/proc_$i.log 2>&1
done
