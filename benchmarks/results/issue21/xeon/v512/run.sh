#!/bin/bash
cd /work/main
FEAT=$(.venv/bin/python -c "import llvmlite.binding as ll; print(ll.get_host_cpu_features().flatten()+',-prefer-256-bit')")
NAME=$(.venv/bin/python -c "import llvmlite.binding as ll; print(ll.get_host_cpu_name())")
for i in 1 2; do
  PYTHONPATH=src .venv/bin/python benchmarks/bench_train_step.py --quick --models tiny-deep small --presets mxfp4 nvfp4 fp8_e4m3 fp4_e2m1_tile128 --rounds 5 --out benchmarks/results/issue21/xeon/v512/base_$i.json > benchmarks/results/issue21/xeon/v512/base_$i.log 2>&1
  NUMBA_CPU_NAME=$NAME NUMBA_CPU_FEATURES=$FEAT PYTHONPATH=src .venv/bin/python benchmarks/bench_train_step.py --quick --models tiny-deep small --presets mxfp4 nvfp4 fp8_e4m3 fp4_e2m1_tile128 --rounds 5 --out benchmarks/results/issue21/xeon/v512/v512_$i.json > benchmarks/results/issue21/xeon/v512/v512_$i.log 2>&1
done
