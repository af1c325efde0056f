#!/usr/bin/env bash
# PLAN.md part 1: 10 alternated process pairs under a busy loop, old thread rule (a worktree
# of HEAD at /tmp/before with fast.py from 0944d522^) against the new one (/work/main);
# resumable (a pair's JSON that exists is skipped).  From the repo root:
#   bash benchmarks/results/issue21/epyc/session24/run_loaded_pairs.sh
set -u
python3 -c 'while True: pass' &
busy=$!
trap 'kill $busy' EXIT
bash benchmarks/run_pairs.sh benchmarks/results/issue21/epyc/session24/loaded_pairs 10 \
  /tmp/before /work/main benchmarks/bench_parallel_min.py \
  --cases tiny-deep:8x128 small:4x256 --presets mxfp4 nvfp4 mxfp4@auto nvfp4@auto \
  --settings adaptive 1048576 --rounds 20 --warmup 3
echo done > /tmp/run_session24_loaded.done
