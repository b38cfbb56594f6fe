#!/usr/bin/env bash
# Installs the test oracles that are not plain wheels: llama-cpp-python, built from
# source as a user's build would be: every x86 instruction set a user's host build uses
# (AVX2, AVX-512 with VNNI, VBMI and BF16), except AMX (its AMX path crashes in VMs that
# do not grant AMX). Its kernels are chosen at run time, so one wheel serves any host. Its sdist is
# kept too, since it also carries llama.cpp's convert_hf_to_gguf.py (the converter
# oracle, tests/support/llama_cpp_convert.py and scripts/make_shape_model.py). Both are cached,
# so only the first run on a machine pays the download and the ~5 minute build.
set -euo pipefail
PY=${PYTHON:-python3}
LLAMA_VERSION=0.3.36
CACHE="${EDGEINFER_CACHE:-$HOME/.cache/edgeinfer}"
GGML_FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_BF16=ON -DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF"
# the cached wheel is keyed by its flags: a wheel built with other flags is never reused
WHEELS="$CACHE/wheels/$(printf %s "$GGML_FLAGS" | sha1sum | cut -c1-12)"
SDIST="$CACHE/sdist/llama_cpp_python-$LLAMA_VERSION.tar.gz"

if [ ! -f "$SDIST" ]; then
  echo "fetching the llama-cpp-python $LLAMA_VERSION sdist (llama.cpp and its converter, once)" >&2
  "$PY" -m pip download -q --no-deps --no-binary llama-cpp-python -d "$(dirname "$SDIST")" "llama-cpp-python==$LLAMA_VERSION"
fi

if "$PY" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$LLAMA_VERSION')" 2>/dev/null; then
  exit 0
fi
mkdir -p "$WHEELS"
wheel=$(ls "$WHEELS"/llama_cpp_python-$LLAMA_VERSION-*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$wheel" ]; then
  echo "building llama-cpp-python $LLAMA_VERSION (the llama.cpp oracle; about 5 minutes, once)" >&2
  CMAKE_ARGS="$GGML_FLAGS" \
    "$PY" -m pip wheel --no-deps -w "$WHEELS" "$SDIST"
  wheel=$(ls "$WHEELS"/llama_cpp_python-$LLAMA_VERSION-*.whl | head -n 1)
fi
"$PY" -m pip install -q "$wheel"
