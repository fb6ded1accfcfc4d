#!/usr/bin/env bash
# Makes a Python 3.12 venv that replicates the lent GPU machine's image as far as raysim and its
# bundle (benchmarks/gpu_bundle.sh) use it: every distribution in replica-cp312.txt beside this
# file, at its exact version (torch 2.11.0 from PyPI, CUDA 13 build, ~3 GB with its CUDA
# libraries), installed with `pip install --no-deps`, so that the cp312 bundle can be tried here
# before a device call. Builds only when the pins change (a stamp holds replica-cp312.txt's
# sha256); either way prints the replica's python on the last line of stdout.
#
#   bash benchmarks/gpu_image/replica.sh      # -> /root/.cache/raysim/image-cp312/bin/python
#   PY312=$(bash benchmarks/gpu_image/replica.sh | tail -n 1)
#   PATH=$(dirname "$PY312"):$PATH PYTHON=$PY312 RAYSIM_BUNDLE=cp312 RAYSIM_IMAGE_GUARD=1 \
#     RAYSIM_SITE=/tmp/raysim-site-cp312 bash benchmarks/gpu_e2e.sh --shape tiny
#
# Every distribution in it must be on image_packages.txt (pip, setuptools and wheel aside): the
# script checks the pins before and the venv after, and fails otherwise. Exit 3: no Python 3.12.
# Environment: RAYSIM_REPLICA (the venv, default ~/.cache/raysim/image-cp312), PYTHON312 (the
# Python 3.12 to build it with; else python3.12 on PATH if it runs, else pyenv's 3.12.x),
# RAYSIM_REPLICA_WHEELS (downloaded wheels, kept for the next build: ~/.cache/raysim/wheels-cp312).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PINS=$HERE/replica-cp312.txt
IMAGE=$HERE/image_packages.txt
DEST=${RAYSIM_REPLICA:-$HOME/.cache/raysim/image-cp312}
WHEELS=${RAYSIM_REPLICA_WHEELS:-$HOME/.cache/raysim/wheels-cp312}
STAMP=$DEST/.raysim-replica
log() { echo "replica: $*" >&2; }

want=$(sha256sum "$PINS" | cut -d' ' -f1)
if [ -x "$DEST/bin/python" ] && [ "$(cat "$STAMP" 2>/dev/null || true)" = "$want" ]; then
  log "up to date at $DEST"
  echo "$DEST/bin/python"
  exit 0
fi

runs312() { [ -n "$1" ] && "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' \
  >/dev/null 2>&1; }
PY=
for c in "${PYTHON312:-}" "$(command -v python3.12 || true)" \
  "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12 \
  /root/.pyenv/versions/3.12*/bin/python3.12; do
  if runs312 "$c"; then PY=$c; break; fi
done
if [ -z "$PY" ]; then
  echo "replica: no Python 3.12 found (set PYTHON312, or install one: pyenv install 3.12)"
  exit 3
fi

# the pins: name==version each, every name on the image (pip/setuptools/wheel aside)
check() {  # check FILE-OF-name==version LABEL
  "$PY" - "$IMAGE" "$1" "$2" <<'EOF'
import re, sys
norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()
image, listing, label = sys.argv[1:]
lines = lambda p: [l.split("#", 1)[0].strip() for l in open(p, encoding="utf-8")]
ok = {norm(l) for l in lines(image) if l} | {"pip", "setuptools", "wheel"}
pins = [l for l in lines(listing) if l]
bad = [p for p in pins if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[^=<>!~ ;]+", p)]
off = [p for p in pins if p not in bad and norm(p.split("==")[0]) not in ok]
if bad or off:
    sys.exit(f"replica: {label}: not name==version: {bad}; not on the image: {off}")
EOF
}
check "$PINS" "$(basename "$PINS")"

t0=$SECONDS
log "building $DEST with $PY ($("$PY" -V 2>&1))"
rm -rf "$DEST"
mkdir -p "$(dirname "$DEST")" "$WHEELS"
"$PY" -m venv "$DEST"
PIP=("$DEST/bin/python" -m pip --disable-pip-version-check)
# wheels only, for this Python, into $WHEELS; pip is asked only when a pin has none there yet
if ! "$PY" - "$PINS" "$WHEELS" <<'EOF'
import os, re, sys
norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()
have = {tuple(f.split("-")[:2]) for f in os.listdir(sys.argv[2]) if f.endswith(".whl")}
have = {(norm(n), v) for n, v in have}
pins = [l.split("#", 1)[0].strip() for l in open(sys.argv[1], encoding="utf-8")]
sys.exit(any((norm(p.split("==")[0]), p.split("==")[1]) not in have for p in pins if p))
EOF
then
  "${PIP[@]}" download -q --no-deps --only-binary=:all: -d "$WHEELS" -r "$PINS" \
    2> >(grep -v "^WARNING: Location" >&2)
fi
log "wheels ready ($(du -sm "$WHEELS" | cut -f1) MiB in $WHEELS), $((SECONDS - t0)) s"
# compiled here (pip's default): under PYTHONDONTWRITEBYTECODE=1 no import would write it
"${PIP[@]}" install -q --no-deps --no-index --only-binary=:all: --find-links "$WHEELS" \
  -r "$PINS" 2> >(grep -v "^WARNING: Location" >&2)

# the venv: exactly the pins (and the venv's pip), each on the image
"${PIP[@]}" list --format=freeze 2>/dev/null >"$DEST/.installed.txt"
check "$DEST/.installed.txt" "the venv"
"$DEST/bin/python" - "$PINS" "$DEST/.installed.txt" <<'EOF'
import re, sys
norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()
def read(p):
    lines = (l.split("#", 1)[0].strip() for l in open(p, encoding="utf-8"))
    return {norm(l.split("==")[0]): l.split("==")[1] for l in lines if l}
pins, got = read(sys.argv[1]), read(sys.argv[2])
got.pop("pip", None)
if pins != got:
    diff = sorted(set(pins.items()) ^ set(got.items()))
    sys.exit(f"replica: the venv does not match the pins: {diff}")
EOF
if ! "${PIP[@]}" check >&2; then log "pip check: see above (a bundle package may fill the gap)"; fi
echo "$want" >"$STAMP"
log "$(($(wc -l <"$DEST/.installed.txt") - 1)) distributions, $(du -sm "$DEST" | cut -f1) MiB," \
  "$((SECONDS - t0)) s"
echo "$DEST/bin/python"
