#!/usr/bin/env bash
set -u
PY=/work/main/.venv/bin/python
OUT=/work/main/benchmarks/results/issue21/xeon/session5
for w in before after; do (cd /tmp/wt_$w && PYTHONPATH=/tmp/wt_$w/src $PY -m snip.formats.warm > /tmp/warm_$w.log 2>&1); done
run() { # $1 arm, $2 out, $3 extra args
  (cd /tmp/wt_$1 && PYTHONPATH=/tmp/wt_$1/src $PY benchmarks/bench_train_step.py --quick --threads 2 --rounds 3 $3 --out $2.json > $2.log 2>&1)
}
for i in 1 2 3 4 5 6 7 8; do
  for w in before after; do [ -f $OUT/${w}_$i.json ] || run $w $OUT/${w}_$i "--models tiny-deep small w256"; done
done
mkdir -p $OUT/loaded
python3 -c "while True: pass" &
BUSY=$!
for i in 1 2 3 4; do
  for w in before after; do [ -f $OUT/loaded/${w}_$i.json ] || run $w $OUT/loaded/${w}_$i "--models small"; done
done
kill $BUSY
echo done > /tmp/run_s5.done
