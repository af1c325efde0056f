#!/usr/bin/env bash
# The runs of PLAN.md: 6 runs, every model, `mxfp4` the only preset (the adaptive arms are
# what is measured); resumable (../targets_runs.sh with this folder).
set -u
OUT=benchmarks/results/issue21/epyc/session19/adaptive_auto PRESETS=mxfp4 \
  bash "$(dirname "$0")/../targets_runs.sh" tiny-deep small small-deep medium w256
echo done > /tmp/run_adaptive_auto.done
