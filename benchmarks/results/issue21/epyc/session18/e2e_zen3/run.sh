#!/usr/bin/env bash
# The processes of PLAN.md (up to 7), one after another; resumable: session 17's run.sh with
# this folder and count.
set -u
OUT=benchmarks/results/issue21/epyc/session18/e2e_zen3 N=7 \
  exec bash "$(dirname "$0")/../../session17/e2e_zen3/run.sh"
