#!/usr/bin/env bash
# Session 20's runs, one plan after another (each folder's PLAN.md), in this order; resumable:
# e2e_t1 (7 x bench_train_e2e.py at 1 thread, fp32, mxfp4 and mxfp4@auto), threads2 (6 x
# bench_train_step.py at 2 threads, every model), e2e_t2 (7 x the e2e command at 2 threads).
set -u
HERE=$(dirname "$0")
S=benchmarks/results/issue21/epyc/session20
OUT=$S/e2e_t1 N=7 THREADS=1 E2E_PRESETS=fp32,mxfp4,mxfp4@auto \
  bash "$HERE/../session17/e2e_zen3/run.sh"
OUT=$S/threads2 THREADS=2 bash "$HERE/../session19/targets_runs.sh" \
  tiny-deep small small-deep medium w256
OUT=$S/e2e_t2 N=7 THREADS=2 E2E_PRESETS=fp32,mxfp4,mxfp4@auto \
  bash "$HERE/../session17/e2e_zen3/run.sh"
echo done > /tmp/run_session20.done
