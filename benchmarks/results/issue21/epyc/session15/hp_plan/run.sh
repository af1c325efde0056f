#!/usr/bin/env bash
# The runs of PLAN.md: 8 alternated process pairs.  Usage (repository root):
#   bash benchmarks/results/issue21/epyc/session15/hp_plan/run.sh <before tree> <after tree>
set -euo pipefail
before=$1; after=$2; out=$PWD/benchmarks/results/issue21/epyc/session15/hp_plan
py=$PWD/.venv/bin/python
for i in 1 2 3 4 5 6 7 8; do
  order=(before after); [ $((i % 2)) -eq 0 ] && order=(after before)
  for arm in "${order[@]}"; do
    tree=$before; [ "$arm" = after ] && tree=$after
    [ -f "$out/${arm}_$i.json" ] && continue
    (cd "$tree" && PYTHONPATH=src "$py" benchmarks/bench_train_step.py --quick --no-warm \
      --no-autocast --threads 1 --models tiny-deep small \
      --presets mxfp4 nvfp4 fp8_e4m3 fp4_e2m1_tile128 bf16 --rounds 5 \
      --out "$out/${arm}_$i.json" > "$out/${arm}_$i.log" 2>&1)
  done
done
