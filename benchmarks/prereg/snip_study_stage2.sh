#!/usr/bin/env bash
# Stage 2 of the pre-registered SNIP study (benchmarks/prereg/snip_study.md §2, "Stage 2"): the
# command written there, run with two workers like Stage 1. Written after Stage 1's results and
# before any Stage 2 output; amendment snip_study_amendment_2026-12-04_stage2.md says why
# nothing in the design changes. Resumable: run it again after any interruption.
#
#   bash benchmarks/prereg/snip_study_stage2.sh            # 2 workers (both cores), niced
#   WORKERS=1 bash benchmarks/prereg/snip_study_stage2.sh  # one worker
#   ROOT=/path/to/checkout bash ...                        # run another checkout's code
#
# Collect the small JSON (results, plans, sensitivity tables, damage maps) for committing:
#   PYTHONPATH=src python benchmarks/snip_compare.py $ARGS --collect benchmarks/results/snip_study/stage2
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
cd "${ROOT:-$HERE/../..}"
PY="${PY:-python}"
WORKERS="${WORKERS:-2}"
OUT="${OUT:-benchmarks/out/snip_study}"
ARGS=(--model small --seeds $(seq 100 115) --base-steps 500 --total-steps 900
      --steps 400 --orders 1 --lr 3e-3 --batch 8 --seq-len 128 --eval-batches 64 --threads 1
      --high fp8_e4m3_tile128 --low fp4_e2m1_tile128 --out "$OUT" --name stage2
      --bases "$OUT/bases_fp8"
      --hypotheses "$HERE/snip_study_stage2_hypotheses.json"
      --arm fp8_e4m3_tile128 --arm low=preset:fp4_e2m1_tile128 --arm oracle@0.875
      --arm snip@0.875/every:100 --arm snip@0.875/once --arm layer_type@0.875
      --arm layer_id@0.875 --arm layer_type_rev@0.875 --arm layer_id_rev@0.875
      --arm random_top@0.875:1 --arm random@0.875x3/unit)
export PYTHONPATH=src
# 1. the 16 fp8 bases, every WORKERS-th seed per worker
for ((i = 0; i < WORKERS; i++)); do
  nice -n 19 "$PY" benchmarks/snip_compare.py "${ARGS[@]}" --bases-only --shard "$i/$WORKERS" &
done
wait
# 2. the branches, unit-major; the first worker writes the definition, the others join it
nice -n 19 "$PY" benchmarks/snip_compare.py "${ARGS[@]}" &
for ((i = 1; i < WORKERS; i++)); do
  until [ -f "$OUT/stage2/sweep.json" ]; do sleep 5; done
  sleep 20
  nice -n 19 "$PY" -m snip.cli compare --resume "$OUT/stage2" --threads 1 &
done
wait
