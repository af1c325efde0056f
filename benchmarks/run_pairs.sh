#!/usr/bin/env bash
# Alternated process pairs of one benchmark in two source trees: the runs of a pre-registered
# before/after plan.  Pair i runs (before, after) for odd i and (after, before) for even i, each
# a fresh process in its tree's root with that tree's src on PYTHONPATH and this checkout's
# .venv; it writes <out>/<arm>_<i>.json and .log, and skips a run whose JSON exists (a stopped
# series resumes where it stopped).  Usage, from the repository root:
#   bash benchmarks/run_pairs.sh <out> <pairs> <before tree> <after tree> <script> [args...]
# e.g. bash benchmarks/run_pairs.sh benchmarks/results/x 8 /tmp/before /tmp/after \
#        benchmarks/bench_train_step.py --quick --threads 1 --models tiny-deep
set -euo pipefail
[ $# -ge 5 ] || { sed -n 2,9p "$0"; exit 2; }
out=$(realpath "$1"); pairs=$2; before=$3; after=$4; script=$5; shift 5
py=$PWD/.venv/bin/python
mkdir -p "$out"
for i in $(seq 1 "$pairs"); do
  order=(before after); [ $((i % 2)) -eq 0 ] && order=(after before)
  for arm in "${order[@]}"; do
    tree=$before; [ "$arm" = after ] && tree=$after
    [ -f "$out/${arm}_$i.json" ] && continue
    (cd "$tree" && PYTHONPATH=src "$py" "$script" "$@" --out "$out/${arm}_$i.json" \
      > "$out/${arm}_$i.log" 2>&1)
  done
done
