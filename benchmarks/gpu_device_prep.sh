#!/usr/bin/env bash
# bitsandbytes for the GPU validation's QLoRA loop, on a GPU machine without a package registry.
#
#   bash benchmarks/gpu_device_prep.sh download   # here (a registry is reachable): the wheel
#                                                 # into .gpu_wheels/ (git-ignored; copy it to
#                                                 # the GPU machine with the checkout)
#   bash benchmarks/gpu_device_prep.sh install    # on the GPU machine: install it, no registry
#
# `install` does nothing when the pinned version is already importable. Without bitsandbytes
# the QLoRA configuration records an error and the others run. PYTHON picks the interpreter.
set -euo pipefail

BNB_VERSION=0.50.2   # memfit's floor on every stack (docs/compat.md)
WHEELS="${WHEELS:-.gpu_wheels}"
PYTHON="${PYTHON:-python}"

have() {
  "$PYTHON" - "$BNB_VERSION" <<'PY'
import importlib.metadata, sys
try:
    sys.exit(0 if importlib.metadata.version("bitsandbytes") == sys.argv[1] else 1)
except importlib.metadata.PackageNotFoundError:
    sys.exit(1)
PY
}

case "${1:-}" in
  download)
    "$PYTHON" -m pip download "bitsandbytes==$BNB_VERSION" --no-deps -d "$WHEELS"
    ls -l "$WHEELS"
    ;;
  install)
    if have; then
      echo "bitsandbytes $BNB_VERSION already installed"
      exit 0
    fi
    shopt -s nullglob
    wheels=("$WHEELS"/bitsandbytes-"$BNB_VERSION"-*.whl)
    if [ ${#wheels[@]} -eq 0 ]; then
      echo "no bitsandbytes $BNB_VERSION wheel in $WHEELS/: run '$0 download' where a registry" \
           "is reachable and copy $WHEELS/ here (the QLoRA configuration fails without it)" >&2
      exit 1
    fi
    "$PYTHON" -m pip install --no-index --no-deps "${wheels[@]}"
    ;;
  *)
    echo "usage: $0 download|install" >&2
    exit 2
    ;;
esac
