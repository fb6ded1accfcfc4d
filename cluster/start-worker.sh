#!/usr/bin/env bash
# Joins a worker node to the cluster whose head is $RAY_HEAD_IP (set by the cluster launcher),
# with the token the head uses (~/.ray/auth_token). Extra arguments go to `ray start`.
#   RAY_USE_TLS=1  Ray's TLS, as on the head (start-head.sh; cluster/README.md, "TLS across
#                  hosts"): every node of a cluster has it on, or none.
#   --dry-run      (first argument) print the Ray settings and the command; start nothing.
# The ports Ray listens on are pinned in common.sh; firewall.sh makes host rules for them.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
DRY_RUN=0
if [[ ${1:-} == --dry-run ]]; then DRY_RUN=1 && shift; fi
export RAY_AUTH_MODE=token
ray_tls_env || exit 2
RAY_START=(ray start --address="$RAY_HEAD_IP:$RAY_GCS_PORT" "${RAY_NODE_PORTS[@]}"
  --disable-usage-stats "$@")
if ((DRY_RUN)); then
  print_ray_env && print_command "${RAY_START[@]}"
  exit 0
fi
ray stop >/dev/null 2>&1 || true
ulimit -n 65536
"${RAY_START[@]}"
