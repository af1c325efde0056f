#!/usr/bin/env bash
# The runs of PLAN.md: 3 alternated pairs of one-call runs, then 8 of step runs.
# Usage (repository root): bash benchmarks/results/issue21/epyc/session14/short_rows/run.sh <before tree> <after tree>
set -euo pipefail
before=$1; after=$2; out=$PWD/benchmarks/results/issue21/epyc/session14/short_rows
py=$PWD/.venv/bin/python
mkdir -p "$out/step"
for i in 1 2 3; do
  order=(before after); [ $((i % 2)) -eq 0 ] && order=(after before)
  for arm in "${order[@]}"; do
    tree=$before; [ "$arm" = after ] && tree=$after
    [ -f "$out/calls_${arm}_$i.json" ] && continue
    (cd "$tree" && PYTHONPATH=src "$py" benchmarks/bench_small_calls.py --no-warm \
      --out "$out/calls_${arm}_$i.json" > "$out/calls_${arm}_$i.log" 2>&1)
  done
done
for i in 1 2 3 4 5 6 7 8; do
  order=(before after); [ $((i % 2)) -eq 0 ] && order=(after before)
  for arm in "${order[@]}"; do
    tree=$before; [ "$arm" = after ] && tree=$after
    [ -f "$out/step/${arm}_$i.json" ] && continue
    (cd "$tree" && PYTHONPATH=src "$py" benchmarks/bench_train_step.py --quick --no-warm \
      --no-autocast --threads 1 --models tiny-deep w256 \
      --presets fp4_e2m1_tile128 fp8_e4m3_tile128 mxfp4 --rounds 5 \
      --out "$out/step/${arm}_$i.json" > "$out/step/${arm}_$i.log" 2>&1)
  done
done
