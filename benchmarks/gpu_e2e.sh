#!/usr/bin/env bash
# raysim's main path on a GPU, in one call of the lent device machine, most valuable figures
# first (docs/gpu.md has the plan and the cost model behind each step's limit):
#   part 1 (about 290 s planned on an H200): preflight, a plain PEFT loop, FedIT with one worker
#     at 1.0 GPU, four at 0.25 and multi-LoRA groups, DeepSpeed ZeRO-2 and Accelerate, FedBaF on
#     ViT-B/16 with the leak auditor, the CUDA tests;
#   part 2 (--part 2, a second call): the fastest kernels, four workers with groups of 2,
#     ZeRO-3, FedOA, a `raysim tune` sweep of 4 trials at 0.5 GPU.
# benchmarks/gpu_e2e.py says what each step measures; the figures land in $OUT/figures.md and
# $OUT/figures.json after every step, every step's log in $OUT/e2e-logs.tar.gz.
#
#   make gpu-bundle                      # here, once: .gpu/bundle-cp312.tar.xz (what the image lacks)
#   bash benchmarks/gpu_e2e.sh           # on the GPU machine, carrying .gpu/bundle-cp312.tar.xz
#   bash benchmarks/gpu_e2e.sh --part 2 --budget 300   # the second call, while the first is warm
#   bash benchmarks/gpu_e2e.sh --shape tiny            # the same steps on this CPU, in minutes
#   make gpu-check                       # CI: --shape tiny under Python 3.12 and the cp312 bundle
#   ONLY="plain fedit:w1_seq" bash benchmarks/gpu_e2e.sh   # some steps (or runs) only
#
# One Ray on loopback serves the whole call (--shape tiny gives it one logical GPU), started in
# the preflight, which ends the call within a minute, with one line naming the cause (exit 3),
# when the environment is broken. Each step has its own limit and the call a budget (--budget,
# 450 s): a failed or cut step costs only itself; exit 1 if any step failed.
set -u
cd "$(dirname "$0")/.."
SHAPE=7b
ARGS=()
while [ $# -gt 0 ]; do
  case $1 in
    --shape) SHAPE=${2:?--shape tiny|7b}; shift 2 ;;
    --part | --budget) ARGS+=("$1" "${2:?$1 needs a value}"); shift 2 ;;
    *) echo "gpu_e2e.sh: unknown argument $1 (use --shape tiny|7b, --part 1|2, --budget S)" >&2
       exit 2 ;;
  esac
done
OUT=${OUT:-gpu-out}
# the bundle (what the GPU image lacks) unpacked and put on the path; its failure is the call's
# shellcheck source=benchmarks/gpu_env.sh
if ! source benchmarks/gpu_env.sh; then
  echo "gpu_e2e: preflight failed: the bundle could not be used (the line above says why)"
  exit 3
fi
PY=${PYTHON:-python3}
# placement must not change results: deterministic cuBLAS workspaces (inherited by Ray's workers)
export CUBLAS_WORKSPACE_CONFIG=:4096:8
exec "$PY" benchmarks/gpu_e2e_run.py --shape "$SHAPE" --out "$OUT" "${ARGS[@]}"
