#!/usr/bin/env bash
# PLAN.md part 3: issue 21's 2-thread step bounds with the new thread rule: 12 runs of
# tiny-deep + small, then 8 of medium + w256 (session 19's targets_runs.sh); resumable. From the
# repository root:
#   bash benchmarks/results/issue21/epyc/session23/run_bounds.sh
set -u
S=benchmarks/results/issue21/epyc/session23
T=benchmarks/results/issue21/epyc/session19/targets_runs.sh
OUT=$S/bounds_t2 N=12 THREADS=2 bash $T tiny-deep small
OUT=$S/bounds_w256_t2 N=8 THREADS=2 bash $T medium w256
echo done > /tmp/run_session23_bounds.done
