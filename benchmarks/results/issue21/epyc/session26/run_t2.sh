#!/usr/bin/env bash
# Session 26's 2-thread runs (t2_rep36/PLAN.md): 36 x bench_train_step.py --quick --no-warm
# --auto --threads 2 --models tiny-deep small --rounds 5 into t2_rep36/, then 12 x the same
# with --models medium w256 into t2_w256_rep12/, one after another, no new run starting at or
# after the plan's cutoff; resumable.
set -u
cd "$(dirname "$0")/../../../../.."
S=benchmarks/results/issue21/epyc/session26
run() {  # OUT N MODELS...
  local out=$1 n=$2; shift 2
  for i in $(seq 1 $n); do
    [ -f $out/run_$i.json ] && continue
    [ "$(date -u +%H%M)" -ge "${CUTOFF:-2300}" ] && return
    PYTHONPATH=src .venv/bin/python benchmarks/bench_train_step.py --quick --no-warm --auto \
      --threads 2 --models "$@" --rounds 5 \
      --out $out/run_$i.json.tmp > $out/run_$i.log 2>&1 && mv $out/run_$i.json.tmp $out/run_$i.json
  done
}
run $S/t2_rep36 36 tiny-deep small
run $S/t2_w256_rep12 12 medium w256
echo done > /tmp/run_session26_t2.done
