#!/usr/bin/env bash
# 6 runs ($N, if set: that many; session 22), one after another, of `bench_train_step.py --quick --no-warm --auto --threads 1
# --rounds 5` over the models given, into $OUT/run_<i>.json (and .log); resumable.  Called by
# targets_zen4/run.sh, bf16_cols/run.sh and adaptive_auto/run.sh with their folders and models
# ($PRESETS, if set: only those presets; $THREADS, if set: that many threads, session 20).
set -u
cd "$(dirname "$0")/../../../../.."
for i in $(seq 1 ${N:-6}); do
  [ -f $OUT/run_$i.json ] && continue
  PYTHONPATH=src .venv/bin/python benchmarks/bench_train_step.py --quick --no-warm --auto \
    --threads ${THREADS:-1} --models "$@" ${PRESETS:+--presets $PRESETS} --rounds 5 \
    --out $OUT/run_$i.json.tmp > $OUT/run_$i.log 2>&1 && mv $OUT/run_$i.json.tmp $OUT/run_$i.json
done
