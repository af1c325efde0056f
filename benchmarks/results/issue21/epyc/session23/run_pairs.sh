#!/usr/bin/env bash
# PLAN.md part 2: 10 alternated process pairs, old rule (/work/main at 7e040e49) against the
# new one (a worktree of branch thread-rule at /tmp/after); resumable. From the repo root:
#   bash benchmarks/results/issue21/epyc/session23/run_pairs.sh
set -u
bash benchmarks/run_pairs.sh benchmarks/results/issue21/epyc/session23/rule_pairs 10 \
  /work/main /tmp/after benchmarks/bench_parallel_min.py \
  --cases tiny-deep:8x128 small:4x256 --presets mxfp4 nvfp4 mxfp4@auto nvfp4@auto \
  --settings adaptive 16384 --rounds 20 --warmup 3
echo done > /tmp/run_session23_pairs.done
