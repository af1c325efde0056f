#!/usr/bin/env bash
# The runs of PLAN.md: 8 alternated process pairs (benchmarks/run_pairs.sh, which took over
# this script's loop unchanged: same order, same commands, same files).  Usage (repository
# root):  bash benchmarks/results/issue21/epyc/session14/hp_route/run.sh <before tree> <after tree>
set -euo pipefail
exec bash benchmarks/run_pairs.sh benchmarks/results/issue21/epyc/session14/hp_route 8 "$1" "$2" \
  benchmarks/bench_train_step.py --quick --no-warm --no-autocast --threads 1 \
  --models tiny-deep small --presets mxfp4 nvfp4 fp8_e4m3 fp4_e2m1_tile128 --rounds 5
