#!/usr/bin/env bash
# Installs the test oracles that are not plain wheels: llama-cpp-python, built from
# source without AMX (its AMX path crashes in VMs that do not grant AMX). The built
# wheel is cached, so only the first run on a machine pays the ~5 minute build.
set -euo pipefail
PY=${PYTHON:-python3}
LLAMA_VERSION=0.3.36
WHEELS="${EDGEINFER_CACHE:-$HOME/.cache/edgeinfer}/wheels"

if "$PY" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$LLAMA_VERSION')" 2>/dev/null; then
  exit 0
fi
mkdir -p "$WHEELS"
wheel=$(ls "$WHEELS"/llama_cpp_python-$LLAMA_VERSION-*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$wheel" ]; then
  echo "building llama-cpp-python $LLAMA_VERSION (the llama.cpp oracle; about 5 minutes, once)" >&2
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=ON -DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF" \
    "$PY" -m pip wheel --no-deps -w "$WHEELS" "llama-cpp-python==$LLAMA_VERSION"
  wheel=$(ls "$WHEELS"/llama_cpp_python-$LLAMA_VERSION-*.whl | head -n 1)
fi
"$PY" -m pip install -q "$wheel"
