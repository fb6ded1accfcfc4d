#!/usr/bin/env bash
# The pieces of a worker on a GPU, without Ray (the first GPU figures in benchmarks/RESULTS.md):
# the CUDA tests (tests/test_gpu.py), what a worker runs per client (fm_clients.py), the batched
# LoRA pass (multilora.py) and FedBaF's server work (fedbaf_cost.py). The whole path through
# `raysim run` and `raysim tune` is benchmarks/gpu_e2e.sh, which a lent GPU runs first.
#
# What the GPU machine's image lacks comes from the bundle `make gpu-bundle` builds
# (benchmarks/gpu_env.sh unpacks it there). Each step has its own time limit and writes its log to
# $OUT (or ./gpu-out), so a slow or failed step costs only itself. ONLY="gpu_tests fedbaf_b16"
# runs only the steps named.
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
source benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.log"
python3 -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers',
transformers.__version__, 'peft', peft.__version__)" | tee -a "$OUT/gpu.log"

step() {  # step NAME SECONDS python3 args...; ONLY="name ..." runs only those steps
  local name=$1 limit=$2
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
  shift 2
  echo "=== $name (limit ${limit}s)"
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "rc=$? wall_s=$((SECONDS - t0))" >>"$OUT/$name.log"
  grep -v "Warning\|warn(" "$OUT/$name.log" | tail -n 40
}

step gpu_tests 120 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py \
  tests/test_multilora.py::test_client_losses_stay_on_the_logits_device
step multilora 170 python3 benchmarks/multilora.py --shape 7b --clients 1 4 16 64 --repeats 2 --steps 2
step fm_fedit 75 python3 benchmarks/fm_clients.py --shape 7b --clients 4 --examples 16 --batch 8
step fm_fedoa 75 python3 benchmarks/fm_clients.py --shape 7b --clients 4 --examples 16 --batch 8 \
  --method fedoa
step fedbaf_b16 120 python3 benchmarks/fedbaf_cost.py --shape b16 --repeats 3
