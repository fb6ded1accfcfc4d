#!/usr/bin/env bash
# Starts Ray and raysim's MLflow server on a cluster's head node (called by the launcher YAMLs'
# head_start_ray_commands; extra arguments go to `ray start`). Nothing it starts listens beyond
# the cluster: the dashboard and job server are on the head's loopback, the MLflow server too,
# and Ray's token authentication is on (the token is ~/.ray/auth_token, which file_mounts ship).
# Reach them from your machine through SSH: see cluster/README.md.
set -euo pipefail
export RAY_AUTH_MODE=token
STORE="${RAYSIM_STORE:-$HOME/raysim-store}"   # the MLflow store: runs and artifacts
mkdir -p "$STORE"
ray stop >/dev/null 2>&1 || true
ulimit -n 65536
ray start --head --port=6379 --object-manager-port=8076 --dashboard-host=127.0.0.1 \
  --disable-usage-stats "$@"
if ! curl -sf http://127.0.0.1:5000/health >/dev/null; then
  # every run's coordinator is kept on the head beside it (raysim/placement.py)
  MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false nohup mlflow server --host 127.0.0.1 --port 5000 \
    --workers 1 --backend-store-uri "sqlite:///$STORE/mlflow.db" \
    --artifacts-destination "$STORE/mlartifacts" >"$STORE/mlflow.log" 2>&1 &
fi
