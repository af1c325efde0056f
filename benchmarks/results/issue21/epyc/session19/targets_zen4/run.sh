#!/usr/bin/env bash
# The runs of PLAN.md (6 runs of the current code at every model), then ../e2e_zen4/PLAN.md's
# (7 processes of session 17's e2e run.sh with that folder); resumable.
set -u
HERE=$(dirname "$0")
OUT=benchmarks/results/issue21/epyc/session19/targets_zen4 \
  bash "$HERE/../targets_runs.sh" tiny-deep small small-deep medium w256
OUT=benchmarks/results/issue21/epyc/session19/e2e_zen4 N=7 \
  bash "$HERE/../../session17/e2e_zen3/run.sh"
echo done > /tmp/run_session19.done
