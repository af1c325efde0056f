#!/usr/bin/env bash
# Session 21's profiles (PLAN.md part 2), then the OpenMP check (part 1); PROFILES=profiles_v2:
# part 3 (the profiles only, into that folder). From the repo root:
#   bash benchmarks/results/issue21/epyc/session21/run.sh
set -euo pipefail
D=benchmarks/results/issue21/epyc/session21
PY=${PY:-.venv/bin/python}
P=$D/${PROFILES:-profiles}
mkdir -p $P
for spec in "small-deep nvfp4 1" "small nvfp4 1" "tiny-deep nvfp4 1" \
            "tiny-deep mxfp4@auto 2" "small nvfp4@auto 2"; do
  set -- $spec
  PYTHONPATH=src $PY benchmarks/profile_step_calls.py --model $1 --preset $2 --threads $3 \
      --out "$P/$1_$2_t$3.json" > "$P/$1_$2_t$3.txt" 2>&1
done
[ -n "${PROFILES:-}" ] || PYTHONPATH=src $PY $D/openmp_runtime.py > $D/openmp_runtime.json
