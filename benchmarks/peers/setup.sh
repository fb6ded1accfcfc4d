#!/usr/bin/env bash
# One virtual environment per peer framework, from PyPI, with pinned versions:
#   benchmarks/peers/.venvs/pfl     pfl-research 0.6.0 (PyTorch)
#   benchmarks/peers/.venvs/flower  Flower 1.42.0 (simulation engine, Ray)
# Idempotent: a venv whose .installed marker exists is skipped (delete the venv to rebuild).
# Usage: bash benchmarks/peers/setup.sh
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENVS="$HERE/.venvs"
PYTHON="${PYTHON:-python3}"  # pfl 0.6.0 needs Python 3.10-3.12, Flower 1.42 needs >= 3.11

TORCH="torch==2.13.0"
NUMPY="numpy==2.4.6"

make_venv() {  # make_venv NAME PACKAGE...
  local name="$1"
  shift
  local dir="$VENVS/$name"
  if [[ -f "$dir/.installed" ]]; then
    echo "[$name] ready: $dir"
    return
  fi
  echo "[$name] creating $dir"
  rm -rf "$dir"
  "$PYTHON" -m venv "$dir"
  "$dir/bin/python" -m pip install --quiet --upgrade "pip==25.2"
  "$dir/bin/python" -m pip install --quiet "$@"
  "$dir/bin/python" -m pip freeze >"$dir/.installed"
  echo "[$name] installed $(wc -l <"$dir/.installed") packages"
}

make_venv pfl "pfl[pytorch]==0.6.0" "$TORCH" "$NUMPY"
make_venv flower "flwr[simulation]==1.42.0" "$TORCH" "$NUMPY"
