#!/usr/bin/env bash
# Stage 3 of the pre-registered SNIP study (benchmarks/prereg/snip_study.md §2, "Stage 3", the
# whole run): the command written there with RULE fixed from Stage 1 and one arm labelled so
# that the hypotheses file names it (amendment snip_study_amendment_2026-12-04_stage3.md, written
# before any Stage 3 output). Run with two workers like Stages 1 and 2; resumable: run it again
# after any interruption.
#
#   bash benchmarks/prereg/snip_study_stage3.sh            # 2 workers (both cores), niced
#   WORKERS=1 bash benchmarks/prereg/snip_study_stage3.sh  # one worker
#   ROOT=/path/to/checkout bash ...                        # run another checkout's code
#
# Collect the small JSON (results, plans, sensitivity tables, damage maps) for committing:
#   PYTHONPATH=src python benchmarks/snip_compare.py $ARGS --collect benchmarks/results/snip_study/stage3
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
cd "${ROOT:-$HERE/../..}"
PY="${PY:-python}"
WORKERS="${WORKERS:-2}"
OUT="${OUT:-benchmarks/out/snip_study}"
RULE=layer_type_rev  # the lowest Stage 1 mean val_loss_hp at 0.875 of the four rules (amendment)
ARGS=(--model small --seeds $(seq 200 211) --base-steps 20 --total-steps 1000 --steps 980
      --orders 1 --lr 3e-3 --batch 8 --seq-len 128 --eval-batches 64 --threads 1
      --high bf16 --low fp4_e2m1_tensor --out "$OUT" --name stage3 --bases "$OUT/bases_run"
      --hypotheses "$HERE/snip_study_stage3_hypotheses.json"
      --arm bf16 --arm low=preset:fp4_e2m1_tensor --arm oracle@0.875=oracle@0.875/every:140
      --arm snip@0.875/every:140 --arm snip@0.875/once
      --arm random_top@0.875:1=random_top@0.875:1/every:140
      --arm "best_rule@0.875=$RULE@0.875/every:140")
export PYTHONPATH=src
# 1. the 12 bf16 bases (20 steps each), every WORKERS-th seed per worker
for ((i = 0; i < WORKERS; i++)); do
  nice -n 19 "$PY" benchmarks/snip_compare.py "${ARGS[@]}" --bases-only --shard "$i/$WORKERS" &
done
wait
# 2. the branches, unit-major; the first worker writes the definition, the others join it
nice -n 19 "$PY" benchmarks/snip_compare.py "${ARGS[@]}" &
for ((i = 1; i < WORKERS; i++)); do
  until [ -f "$OUT/stage3/sweep.json" ]; do sleep 5; done
  sleep 20
  nice -n 19 "$PY" -m snip.cli compare --resume "$OUT/stage3" --threads 1 &
done
wait
