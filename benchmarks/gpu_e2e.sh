#!/usr/bin/env bash
# raysim's main path on a GPU, in one call of the lent device machine (about 8 minutes):
# `raysim run` FedIT on a LLaMA-7B-shaped bf16 model in five placements against a plain PEFT
# loop, the DeepSpeed (ZeRO-2, ZeRO-3) and Accelerate backends, FedOA, a `raysim tune` sweep of 4
# trials at 0.5 GPU, FedBaF on ViT-B/16; then the CUDA tests. benchmarks/gpu_e2e.py says what each
# step measures; the figures land in $OUT/figures.md and $OUT/figures.json.
#
#   make gpu-bundle                      # here, once: .gpu/bundle-cp312.tar.xz (what the image lacks)
#   bash benchmarks/gpu_e2e.sh           # on the GPU machine, carrying .gpu/bundle-cp312.tar.xz
#                                        # (the file, not .gpu/); the figures and logs in $OUT
#   make gpu-check                       # CI: --shape tiny under the image guard (docs/gpu.md)
#   bash benchmarks/gpu_e2e.sh --shape tiny    # the same steps on this CPU, in minutes
#   ONLY="plain fedit" bash benchmarks/gpu_e2e.sh   # some steps only
#   ONLY="multilora fm_fedit fm_fedoa fedbaf_b16" bash benchmarks/gpu_e2e.sh
#                                        # the pieces of a worker without Ray (the first GPU
#                                        # figures in RESULTS.md); they run only when named
#
# --shape tiny starts a Ray on loopback with one logical GPU (so that four workers at 0.25 GPU
# and trials at 0.5 GPU are placed as on a card) and stops it at the end; on a GPU each
# `raysim run` starts its own private Ray, as a user's would. Each step has its own time limit,
# so a slow or failed step costs only itself; the script exits non-zero if any step failed.
set -u
cd "$(dirname "$0")/.."
SHAPE=7b
while [ $# -gt 0 ]; do
  case $1 in
    --shape) SHAPE=$2; shift 2 ;;
    *) echo "gpu_e2e.sh: unknown argument $1 (use --shape tiny|7b)" >&2; exit 2 ;;
  esac
done
# Work where the runs' stores and artifacts may grow; $OUT (the device tool's, at most 8 files
# come back) gets the figures and one archive of every step's log and JSON after each step.
OUT=${OUT:-gpu-out}
WORK=${RAYSIM_E2E_WORK:-$OUT}
[ -n "${RAYSIM_E2E_WORK:-}" ] || [ "$OUT" = gpu-out ] || WORK=/tmp/raysim-gpu-e2e
mkdir -p "$OUT" "$WORK"
OUT=$(cd "$OUT" && pwd)
WORK=$(cd "$WORK" && pwd)
# shellcheck source=benchmarks/gpu_env.sh
source benchmarks/gpu_env.sh
PY=${PYTHON:-python3}
# placement must not change results: deterministic cuBLAS workspaces (inherited by Ray's workers)
export CUBLAS_WORKSPACE_CONFIG=:4096:8

ADDRESS=()
if [ "$SHAPE" = tiny ]; then
  PORT=${RAYSIM_E2E_PORT:-6392}
  RAY_CLI=$(command -v ray || echo "$PY -m ray.scripts.scripts")
  RAY_TMP=/tmp/raysim-e2e-ray-$$  # its own: stopping it touches no other Ray on the machine
  $RAY_CLI start --head --node-ip-address 127.0.0.1 --port "$PORT" --num-cpus 4 --num-gpus 1 \
    --temp-dir "$RAY_TMP" --include-dashboard false --disable-usage-stats \
    >"$WORK/ray-start.log" 2>&1 || { echo "ray start failed:"; tail -5 "$WORK/ray-start.log"; exit 1; }
  trap 'pkill -9 -f "$RAY_TMP" >/dev/null 2>&1; rm -rf "$RAY_TMP"' EXIT
  ADDRESS=(--address "127.0.0.1:$PORT")
else
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.log"
fi

FAILED=()
SCALE=1
[ "$SHAPE" = tiny ] && SCALE=2  # time limits are the GPU's; a 2-vCPU machine gets twice them
E2E=("$PY" benchmarks/gpu_e2e.py --shape "$SHAPE" --out "$WORK" "${ADDRESS[@]}")
collect() {  # the report so far, copied to $OUT with the logs
  "${E2E[@]}" report >"$WORK/report.log" 2>&1
  if [ "$WORK" != "$OUT" ]; then
    cp "$WORK"/figures.md "$WORK"/figures.json "$WORK"/report.log "$OUT"/ 2>/dev/null
    (cd "$WORK" && tar czf "$OUT/e2e-logs.tar.gz" --exclude='artifacts' --exclude='mlartifacts' \
      --exclude='mlflow.db*' --exclude='tune' --exclude='foundation-*' . 2>/dev/null)
  fi
}
step() {  # step NAME SECONDS command...; ONLY="name ..." runs only those steps
  # (a command that is `e2e ARGS` runs benchmarks/gpu_e2e.py ARGS)
  local name=$1 limit=$(($2 * SCALE))
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
  shift 2
  if [ "$1" = e2e ]; then shift; set -- "${E2E[@]}" "$@"; fi
  echo "=== $name (limit ${limit}s)"
  local t0=$SECONDS rc
  timeout -k 10 "$limit" "$@" >"$WORK/$name.log" 2>&1
  rc=$?
  echo "rc=$rc wall_s=$((SECONDS - t0))" | tee -a "$WORK/$name.log"
  [ $rc -eq 0 ] || { FAILED+=("$name"); tail -n 25 "$WORK/$name.log" | head -n 24; }
  collect
}

# the order is the issue's priority: a step cut short by the call's own limit loses the least
step machine 30 e2e machine
step plain 60 e2e plain
step fedit 200 e2e fedit
step backends 100 e2e backends --rounds 2 --run-limit $((40 * SCALE))
step fedoa 50 e2e fedoa --rounds 2
step tune 50 e2e tune
step fedbaf 50 e2e fedbaf
piece() {  # a step that runs only where ONLY names it
  [[ " ${ONLY:-} " == *" $1 "* ]] && step "$@"
}
if [ "$SHAPE" != tiny ]; then
  step gpu_tests 30 "$PY" -m pytest -q -p no:cacheprovider tests/test_gpu.py \
    tests/test_multilora.py::test_client_losses_stay_on_the_logits_device
  piece multilora 170 "$PY" benchmarks/multilora.py --shape 7b --clients 1 4 16 64 --repeats 2 \
    --steps 2
  piece fm_fedit 75 "$PY" benchmarks/fm_clients.py --shape 7b --clients 4 --examples 16 --batch 8
  piece fm_fedoa 75 "$PY" benchmarks/fm_clients.py --shape 7b --clients 4 --examples 16 \
    --batch 8 --method fedoa
  piece fedbaf_b16 120 "$PY" benchmarks/fedbaf_cost.py --shape b16 --repeats 3
fi
cat "$WORK/report.log"
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "failed steps: ${FAILED[*]} (logs in $WORK)"
  exit 1
fi
