#!/usr/bin/env bash
# PLAN.md part 5: 14 end-to-end processes at 1 thread (mxfp4@auto), then 14 at 2 threads
# (mxfp4, mxfp4@auto); resumable (a finished run_<i>.json is kept). From the repo root:
#   bash benchmarks/results/issue21/epyc/session21/e2e_run.sh
set -u
S=benchmarks/results/issue21/epyc/session21
E2E=benchmarks/results/issue21/epyc/session17/e2e_zen3/run.sh
OUT=$S/e2e_t1 N=14 THREADS=1 E2E_PRESETS=mxfp4@auto bash $E2E
OUT=$S/e2e_t2 N=14 THREADS=2 E2E_PRESETS=mxfp4,mxfp4@auto bash $E2E
echo done > /tmp/run_session21_e2e.done
