#!/usr/bin/env bash
# Joins a worker node to the cluster whose head is $RAY_HEAD_IP (set by the cluster launcher),
# with the token the head uses (~/.ray/auth_token). Extra arguments go to `ray start`.
set -euo pipefail
export RAY_AUTH_MODE=token
ray stop >/dev/null 2>&1 || true
ulimit -n 65536
ray start --address="$RAY_HEAD_IP:6379" --object-manager-port=8076 --disable-usage-stats "$@"
