# Sourced by start-head.sh, start-worker.sh and firewall.sh; defines, starts nothing.
#
# The ports Ray listens on, pinned so that a host firewall can name them (cluster/README.md,
# "Firewall on your own machines"). Left to Ray, the node manager, the dashboard agent's gRPC
# port, the runtime-env agent and the metrics exporter would take random ports. The dashboard
# (RAY_DASHBOARD_PORT) listens on the head's loopback only.
RAY_GCS_PORT=6379              # head: the GCS, which every node and driver dials
RAY_DASHBOARD_PORT=8265        # head: dashboard and job server (127.0.0.1)
RAY_CLIENT_SERVER_PORT=10001   # head: Ray Client (ray://); raysim does not use it
RAY_NODE_PORTS=(               # every node
  --object-manager-port=8076
  --node-manager-port=8077
  --dashboard-agent-grpc-port=8078
  --runtime-env-agent-port=8079
  --metrics-export-port=8080
  --dashboard-agent-listen-port=52365
  --min-worker-port=10002      # each worker process (actor, task) listens on one of these
  --max-worker-port=19999
)

# Ray's TLS on its gRPC channels (cluster/README.md, "TLS across hosts"): off unless RAY_USE_TLS
# is 1 or true. Then the node's certificate, its key and the cluster's CA certificate come from
# RAY_TLS_SERVER_CERT, RAY_TLS_SERVER_KEY and RAY_TLS_CA_CERT; each one not set defaults to
# ${RAY_TLS_DIR:-~/.ray/tls}/node.crt, node.key, ca.crt. A file that is not there stops the
# script before Ray starts (exit 2), rather than Ray failing on every node later.
ray_tls_env() {
  case "${RAY_USE_TLS:-0}" in
    0 | false | FALSE | False | "")
      unset RAY_USE_TLS
      return 0
      ;;
    1 | true | TRUE | True) ;;
    *)
      echo "$0: RAY_USE_TLS must be 1 (TLS on) or 0, not '${RAY_USE_TLS}'" >&2
      return 2
      ;;
  esac
  local dir="${RAY_TLS_DIR:-$HOME/.ray/tls}" f
  export RAY_USE_TLS=1
  export RAY_TLS_SERVER_CERT="${RAY_TLS_SERVER_CERT:-$dir/node.crt}"
  export RAY_TLS_SERVER_KEY="${RAY_TLS_SERVER_KEY:-$dir/node.key}"
  export RAY_TLS_CA_CERT="${RAY_TLS_CA_CERT:-$dir/ca.crt}"
  for f in "$RAY_TLS_SERVER_CERT" "$RAY_TLS_SERVER_KEY" "$RAY_TLS_CA_CERT"; do
    if [[ ! -r $f ]]; then
      echo "$0: RAY_USE_TLS=1 but $f is not a readable file (cluster/README.md, TLS across hosts)" >&2
      return 2
    fi
  done
}

# --dry-run: the Ray settings of the environment the script made, one a line, then each command
# it would run, shell-quoted, one a line.
print_ray_env() {
  env | grep -E '^RAY_(AUTH_MODE|USE_TLS|TLS_[A-Z_]+)=' | sort || true
}
print_command() {
  local quoted
  printf -v quoted '%q ' "$@"
  echo "${quoted% }"
}
