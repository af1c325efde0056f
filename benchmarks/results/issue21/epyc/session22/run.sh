#!/usr/bin/env bash
# Session 22's runs (threads2_rep/PLAN.md): 12 x bench_train_step.py --quick --no-warm --auto
# --threads 2 --models tiny-deep small --rounds 5, one after another; resumable.
set -u
HERE=$(dirname "$0")
OUT=benchmarks/results/issue21/epyc/session22/threads2_rep N=12 THREADS=2 \
  bash "$HERE/../session19/targets_runs.sh" tiny-deep small
echo done > /tmp/run_session22.done
