#!/usr/bin/env bash
# Session 22's second runs (threads1_rep/PLAN.md): 12 x bench_train_step.py --quick --no-warm
# --auto --threads 1 --models tiny-deep small small-deep --rounds 5, one after another; resumable.
set -u
HERE=$(dirname "$0")
OUT=benchmarks/results/issue21/epyc/session22/threads1_rep N=12 THREADS=1 \
  bash "$HERE/../session19/targets_runs.sh" tiny-deep small small-deep
echo done > /tmp/run_session22_t1.done
