#!/usr/bin/env bash
# The 6 processes of PLAN.md, one after another; resumable: session 17's run.sh (its ab.py,
# unchanged) with this folder.
set -u
OUT=benchmarks/results/issue21/epyc/session18/twins_ab \
  exec bash "$(dirname "$0")/../../session17/twins_ab/run.sh"
