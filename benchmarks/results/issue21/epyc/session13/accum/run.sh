#!/usr/bin/env bash
# One `snip train --train.grad_accum 2` (fixed mxfp4, otherwise defaults) on each tree, then the
# losses of both compared bit for bit (compare.py).  A check of bits, and one descriptive pair of
# timings, not a paired comparison.  Usage (repository root): bash run.sh <before> <after> <dir>
set -euo pipefail
before=$1; after=$2; dir=$3
for arm in before after; do
  tree=$before; [ "$arm" = after ] && tree=$after
  /usr/bin/time -f "$arm wall %e s cpu %U+%S s" env PYTHONPATH=$tree/src .venv/bin/python \
    -m snip.cli train --train.grad_accum 2 --precision.mode fixed --precision.preset mxfp4 \
    --run.dir "$dir" --run.name $arm --log.progress false > "$dir/$arm.out" 2>> "$dir/times.txt"
done
cat "$dir/times.txt"
python benchmarks/results/issue21/epyc/session13/accum/compare.py "$dir/before" "$dir/after"
