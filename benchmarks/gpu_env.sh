# Sourced, not run (by scripts on the lent GPU machine, and here): `source benchmarks/gpu_env.sh`.
# Makes the image's python3 see the bundle that benchmarks/gpu_bundle.sh built and the repo:
#  - .gpu/bundle-<tag>.tar.xz (tag: that of ${PYTHON:-python3}, cp312 on the GPU image, or
#    RAYSIM_BUNDLE=<tag>; RAYSIM_BUNDLE=none uses none), where it exists, is unpacked
#    once into ${RAYSIM_SITE:-/tmp/raysim-site} (again only when the bundle changes: a stamp
#    holds its checksum), compiled there on every core, and put first on PYTHONPATH, its bin/
#    on PATH (RAYSIM_BUNDLE_TAR names it);
#  - the repo root goes on PYTHONPATH (raysim is not installed there);
#  - RAYSIM_IMAGE_GUARD=1 also puts benchmarks/gpu_image/ first on PYTHONPATH: its
#    sitecustomize makes every Python process refuse what neither the image nor the bundle has
#    (to prove the bundle complete on a machine that has more);
#  - Ray without its auth, Hugging Face offline, unbuffered output (each settable before).
# Works under `set -euo pipefail`, and sourced twice; returns non-zero if unpacking fails.

_rs_root=$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/.." && pwd)
# the bundle built for the Python that will run (${PYTHON:-python3}): cp312 on the GPU image; a
# bundle for another Python would not load (its compiled parts are that Python's)
_rs_tag=${RAYSIM_BUNDLE:-$("${PYTHON:-python3}" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')}
_rs_tar=$_rs_root/.gpu/bundle-$_rs_tag.tar.xz
_rs_rc=0

_rs_path() {  # _rs_path VAR DIR: DIR first in the :-list VAR, once
  local now=${!1:-}
  case ":$now:" in
    *":$2:"*) ;;
    *) export "$1=$2${now:+:$now}" ;;
  esac
}

if [ "${RAYSIM_BUNDLE:-}" = none ]; then
  :  # no bundle: this Python's own packages (a GPU machine that has them all)
elif [ -f "$_rs_tar" ]; then
  export RAYSIM_SITE=${RAYSIM_SITE:-/tmp/raysim-site}
  _rs_stamp="$_rs_tag $(sha256sum "$_rs_tar" | cut -d' ' -f1) compiled"
  if [ "$(cat "$RAYSIM_SITE/.raysim-bundle" 2>/dev/null || true)" != "$_rs_stamp" ]; then
    _rs_new=$RAYSIM_SITE.new.$$
    rm -rf "$_rs_new" && mkdir -p "$_rs_new"
    if command -v xz >/dev/null 2>&1; then
      tar -C "$_rs_new" -xJf "$_rs_tar" || _rs_rc=1
    else  # no xz binary: Python's lzma
      python3 -c 'import sys, tarfile
t = tarfile.open(sys.argv[1])
kw = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}
t.extractall(sys.argv[2], **kw)' "$_rs_tar" "$_rs_new" || _rs_rc=1
    fi
    if [ "$_rs_rc" = 0 ]; then
      rm -rf "$RAYSIM_SITE" && mv "$_rs_new" "$RAYSIM_SITE" || _rs_rc=1
      # compiled once here, on every core, not by each process's first imports (the bundle
      # ships no .pyc); in place, so that tracebacks name the files where they are
      "${PYTHON:-python3}" -m compileall -q -j 0 "$RAYSIM_SITE" >/dev/null 2>&1 || true
      [ "$_rs_rc" = 0 ] && echo "$_rs_stamp" >"$RAYSIM_SITE/.raysim-bundle"
      echo "gpu_env: unpacked $(basename "$_rs_tar") into $RAYSIM_SITE and compiled it" >&2
    else
      echo "gpu_env: could not unpack $_rs_tar" >&2
      rm -rf "$_rs_new"
    fi
  fi
  if [ "$_rs_rc" = 0 ]; then
    export RAYSIM_BUNDLE_TAR=$_rs_tar
    _rs_path PYTHONPATH "$RAYSIM_SITE"
    if [ -d "$RAYSIM_SITE/bin" ]; then _rs_path PATH "$RAYSIM_SITE/bin"; fi
  fi
elif [ -n "${RAYSIM_BUNDLE:-}" ]; then
  echo "gpu_env: no $_rs_tar (RAYSIM_BUNDLE=$RAYSIM_BUNDLE): bash benchmarks/gpu_bundle.sh" >&2
  _rs_rc=1
fi
_rs_path PYTHONPATH "$_rs_root"
if [ "${RAYSIM_IMAGE_GUARD:-}" = 1 ]; then
  _rs_path PYTHONPATH "$_rs_root/benchmarks/gpu_image"
  if [ -f "$_rs_root/.gpu/guard-$_rs_tag.txt" ]; then
    export RAYSIM_IMAGE_BLOCKED=$_rs_root/.gpu/guard-$_rs_tag.txt
  fi
  export RAYSIM_IMAGE_GUARD
fi
# The call's Ray (loopback only) takes calls only from processes with this shell's token.
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}
if [ "$RAY_AUTH_MODE" = token ] && [ -z "${RAY_AUTH_TOKEN:-}" ] && [ -z "${RAY_AUTH_TOKEN_PATH:-}" ]; then
  RAY_AUTH_TOKEN=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
  export RAY_AUTH_TOKEN
fi
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
export TRANSFORMERS_OFFLINE=${TRANSFORMERS_OFFLINE:-1}
export TOKENIZERS_PARALLELISM=${TOKENIZERS_PARALLELISM:-false}
export PYTHONUNBUFFERED=${PYTHONUNBUFFERED:-1}
unset -f _rs_path
unset _rs_root _rs_tag _rs_tar _rs_stamp _rs_new
# shellcheck disable=SC2317  # `return` when sourced, `exit` when run
eval "unset _rs_rc; return $_rs_rc 2>/dev/null || exit $_rs_rc"
