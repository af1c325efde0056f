#!/usr/bin/env bash
# Stage 1 of the pre-registered SNIP study (benchmarks/prereg/snip_study.md), as committed
# before any of its branches ran. Resumable: run it again after any interruption (finished
# bases and branches are kept; interrupted branches resume from their checkpoint).
#
#   bash benchmarks/prereg/snip_study_stage1.sh            # 2 workers (both cores), niced
#   WORKERS=1 bash benchmarks/prereg/snip_study_stage1.sh  # one worker
#
# Collect the small JSON (results, plans, sensitivity tables, damage maps) for committing:
#   PYTHONPATH=src python benchmarks/snip_compare.py $ARGS --collect benchmarks/results/snip_study/stage1
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PY:-python}"
WORKERS="${WORKERS:-2}"
OUT="${OUT:-benchmarks/out/snip_study}"
ARGS=(--model small --n-seeds 48 --base-steps 500 --total-steps 900 --warmup-steps 20
      --steps 400 --orders 1 --lr 3e-3 --batch 8 --seq-len 128 --eval-batches 64 --threads 1
      --high bf16 --low fp4_e2m1_tensor --out "$OUT" --name stage1
      --hypotheses benchmarks/prereg/snip_study_stage1_hypotheses.json
      --arm bf16 --arm low=preset:fp4_e2m1_tensor --arm oracle@0.875)
for r in 0.75 0.875; do
  ARGS+=(--arm "snip@$r/every:100" --arm "snip@$r/once" --arm "layer_type@$r"
         --arm "layer_id@$r" --arm "layer_type_rev@$r" --arm "layer_id_rev@$r"
         --arm "random_top@$r:1" --arm "random@${r}x3/unit")
done
ARGS+=(--arm "snip@0.875/sum/every:100")
export PYTHONPATH=src
# 1. the 48 bf16 bases, every WORKERS-th seed per worker
for ((i = 0; i < WORKERS; i++)); do
  nice -n 19 "$PY" benchmarks/snip_compare.py "${ARGS[@]}" --bases-only --shard "$i/$WORKERS" &
done
wait
# 2. the branches, unit-major; the first worker writes the definition, the others join it
nice -n 19 "$PY" benchmarks/snip_compare.py "${ARGS[@]}" &
for ((i = 1; i < WORKERS; i++)); do
  until [ -f "$OUT/stage1/sweep.json" ]; do sleep 5; done
  sleep 20
  nice -n 19 "$PY" -m snip.cli compare --resume "$OUT/stage1" --threads 1 &
done
wait
