#!/bin/sh
# Every GPU benchmark, results under $OUT when set, else bench_results/gpu:
#   sh benchmarks/run_gpu_all.sh [kernels] [engine] [json] [prefix]     (no argument: all four, ~10 min)
# Needs `make gpu-bundle` carried (tokenizer + wheels; make bench-gpu sets PYTHONPATH/SGLPY_TOKENIZER_DIR).
out=${OUT:-bench_results/gpu}; py=${PYTHON:-python3}; steps=${*:-kernels engine json prefix}; rc=0; mkdir -p "$out"
{ nvidia-smi; $py -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > "$out/env.txt" 2>&1
for s in $steps; do case $s in
  kernels) $py benchmarks/kernels.py --max-gib 36 --json "$out/kernels.json" > "$out/kernels.txt" 2>&1 || rc=1 ;;
  engine) $py benchmarks/gpu_engine.py --profile --json "$out/gpu_engine.json" > "$out/gpu_engine.txt" 2>&1 || rc=1 ;;
  json) $py benchmarks/json_decode.py --model preset:smollm2-135m --device cuda > "$out/json_decode.txt" 2>&1 || rc=1 ;;
  prefix) $py benchmarks/prefix_sharing.py --no-hf --model preset:smollm2-135m --device cuda --dtype bfloat16 \
            --json "$out/prefix_sharing.json" > "$out/prefix_sharing.txt" 2>&1 || rc=1 ;;
  *) echo "unknown step $s (kernels, engine, json, prefix)"; rc=2 ;;
esac; done
tail -n 30 "$out"/*.txt
exit $rc
