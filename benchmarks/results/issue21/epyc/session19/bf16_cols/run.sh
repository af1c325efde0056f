#!/usr/bin/env bash
# The runs of PLAN.md: 6 runs of the fixed code at widths 64 and 128, one after another;
# resumable (../targets_runs.sh with this folder).
set -u
OUT=benchmarks/results/issue21/epyc/session19/bf16_cols \
  bash "$(dirname "$0")/../targets_runs.sh" tiny-deep small small-deep
echo done > /tmp/run_bf16_cols.done
