#!/usr/bin/env bash
# Starts Ray and raysim's MLflow server on a cluster's head node (called by the launcher YAMLs'
# head_start_ray_commands; extra arguments go to `ray start`). Nothing it starts listens beyond
# the cluster: the dashboard and job server are on the head's loopback, the MLflow server too,
# and Ray's token authentication is on (the token is ~/.ray/auth_token, which file_mounts ship).
# Reach them from your machine through SSH: see cluster/README.md.
#   RAY_USE_TLS=1  Ray's TLS between the nodes, with RAY_TLS_SERVER_CERT, RAY_TLS_SERVER_KEY and
#                  RAY_TLS_CA_CERT (default ~/.ray/tls/node.crt, node.key, ca.crt); off if unset.
#                  Set it on every node, workers too (cluster/README.md, "TLS across hosts").
#   --dry-run      (first argument) print the Ray settings and the commands; start nothing.
# The ports Ray listens on are pinned in common.sh; firewall.sh makes host rules for them.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
DRY_RUN=0
if [[ ${1:-} == --dry-run ]]; then DRY_RUN=1 && shift; fi
export RAY_AUTH_MODE=token
ray_tls_env || exit 2
STORE="${RAYSIM_STORE:-$HOME/raysim-store}"   # the MLflow store: runs and artifacts
RAY_START=(ray start --head --port="$RAY_GCS_PORT" --dashboard-host=127.0.0.1
  --dashboard-port="$RAY_DASHBOARD_PORT" --ray-client-server-port="$RAY_CLIENT_SERVER_PORT"
  "${RAY_NODE_PORTS[@]}" --disable-usage-stats "$@")
# every run's coordinator is kept on the head beside it (raysim/launch/placement.py)
MLFLOW=(mlflow server --host 127.0.0.1 --port 5000 --workers 1
  --backend-store-uri "sqlite:///$STORE/mlflow.db" --artifacts-destination "$STORE/mlartifacts")
if ((DRY_RUN)); then
  print_ray_env && print_command "${RAY_START[@]}" && print_command "${MLFLOW[@]}"
  exit 0
fi
mkdir -p "$STORE"
ray stop >/dev/null 2>&1 || true
ulimit -n 65536
"${RAY_START[@]}"
if ! curl -sf http://127.0.0.1:5000/health >/dev/null; then
  MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false nohup "${MLFLOW[@]}" >"$STORE/mlflow.log" 2>&1 &
fi
