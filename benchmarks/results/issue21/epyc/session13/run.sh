#!/usr/bin/env bash
# Session 13's pre-registered runs (PLAN.md): 4 alternated process pairs, before / after.
# Usage: bash run.sh <before tree> <after tree>   (from the repository root)
set -euo pipefail
before=$1; after=$2; out=benchmarks/results/issue21/epyc/session13
order=(before after after before before after after before)
for i in "${!order[@]}"; do
  arm=${order[$i]}; tree=$before; [ "$arm" = after ] && tree=$after
  pair=$(( i / 2 + 1 ))
  PYTHONPATH=$tree/src .venv/bin/python benchmarks/bench_small_calls.py --placed \
    --out "$out/${arm}_${pair}.json" > "$out/${arm}_${pair}.log"
done
