#!/usr/bin/env bash
# PLAN.md part 4: snip train end to end at 2 threads with the new thread rule, up to 14
# processes, none started after ${CUTOFF:-1615} UTC; resumable. From the repository root:
#   bash benchmarks/results/issue21/epyc/session23/run_e2e.sh
set -u
S=benchmarks/results/issue21/epyc/session23
mkdir -p $S/e2e_t2
for i in $(seq 1 14); do
  [ "$(date -u +%H%M)" -ge "${CUTOFF:-1615}" ] && break
  OUT=$S/e2e_t2 N=$i THREADS=2 E2E_PRESETS=mxfp4,mxfp4@auto \
    bash benchmarks/results/issue21/epyc/session17/e2e_zen3/run.sh
done
echo done > /tmp/run_session23_e2e.done
