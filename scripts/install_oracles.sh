#!/usr/bin/env bash
# Installs the test oracles that are not plain wheels: llama-cpp-python, built from
# source as a user's build would be: every x86 instruction set of this host that a user's
# native build uses (AVX2, and AVX-512 with VNNI, VBMI and BF16 where the CPU has them), except
# AMX (its AMX path crashes in VMs that do not grant AMX). The flags follow the host (ggml
# compiled with AVX-512 dies with SIGILL on an AVX2-only CPU), and the wheel is cached by its
# flags. Its sdist is kept too, since it also carries llama.cpp's convert_hf_to_gguf.py (the
# converter oracle, tests/support/llama_cpp_convert.py and scripts/make_shape_model.py). Both are
# cached, so only the first run on a machine pays the download and the ~5 minute build.
set -euo pipefail
PY=${PYTHON:-python3}
LLAMA_VERSION=0.3.36
CACHE="${EDGEINFER_CACHE:-$HOME/.cache/edgeinfer}"
CPU_FLAGS=" $(grep -m1 -w '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
has() { case "$CPU_FLAGS" in *" $1 "*) return 0 ;; esac; return 1; }
GGML_FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON"
if has avx512f; then
  GGML_FLAGS="$GGML_FLAGS -DGGML_AVX512=ON"
  if has avx512_vnni; then GGML_FLAGS="$GGML_FLAGS -DGGML_AVX512_VNNI=ON"; fi
  if has avx512vbmi; then GGML_FLAGS="$GGML_FLAGS -DGGML_AVX512_VBMI=ON"; fi
  if has avx512_bf16; then GGML_FLAGS="$GGML_FLAGS -DGGML_AVX512_BF16=ON"; fi
fi
GGML_FLAGS="$GGML_FLAGS -DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF"
# the cached wheel is keyed by its flags: a wheel built with other flags is never reused
WHEELS="$CACHE/wheels/$(printf %s "$GGML_FLAGS" | sha1sum | cut -c1-12)"
SDIST="$CACHE/sdist/llama_cpp_python-$LLAMA_VERSION.tar.gz"

if [ ! -f "$SDIST" ]; then
  echo "fetching the llama-cpp-python $LLAMA_VERSION sdist (llama.cpp and its converter, once)" >&2
  "$PY" -m pip download -q --no-deps --no-binary llama-cpp-python -d "$(dirname "$SDIST")" "llama-cpp-python==$LLAMA_VERSION"
fi

# installed, and built with this host's flags (a machine image may carry another host's build)
if "$PY" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$LLAMA_VERSION')" 2>/dev/null \
    && [ "$(cat "$CACHE/wheels/installed-flags" 2>/dev/null)" = "$GGML_FLAGS" ]; then
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
"$PY" -m pip uninstall -q -y llama-cpp-python >/dev/null 2>&1 || true   # another host's build
"$PY" -m pip install -q "$wheel"
printf %s "$GGML_FLAGS" > "$CACHE/wheels/installed-flags"
