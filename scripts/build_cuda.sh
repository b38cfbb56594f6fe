#!/usr/bin/env bash
# Builds the CUDA backend, libedgeinfer_cuda.so, alone: the edgeinfer_cuda target of
# CMakeLists.txt (the one `EDGEINFER_CUDA=1 pip install .` builds), with real cubins for
# sm_75 (T4), sm_87 (Jetson Orin) and sm_90 (H200), into native/cuda/build/ and a copy in
# edgeinfer/ (where edgeinfer.backends.cuda looks for it; $EDGEINFER_CUDA_LIB wins).
#
# Without nvcc it prints why and exits 0, so CPU-only machines and CI without
# CUDA pass; with nvcc a compile error fails (exit != 0).
#   EDGEINFER_CUDA_ARCHS="75"   build only these archs (default "75 87 90"; for iterating)
#   NVCC=/path/to/nvcc          compiler (default: nvcc on PATH, then /usr/local/cuda/bin/nvcc)
#   EDGEINFER_CUDA_REQUIRE=1    a missing nvcc is an error (exit 1) instead of a skip
#   EDGEINFER_CUDA_OUT=DIR      build into DIR only (no copy into edgeinfer/; used by tests)
#   EDGEINFER_CUDA_JOBS=N       nvcc --threads (default 2)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${NVCC+set}" ]; then
    NVCC=$(command -v nvcc || true)
    if [ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ]; then NVCC=/usr/local/cuda/bin/nvcc; fi
fi
if [ -z "$NVCC" ] || ! [ -x "$(command -v "$NVCC" || true)" ]; then
    echo "build_cuda: nvcc not found${NVCC:+ at $NVCC}; skipping the CUDA backend (CPU-only build)"
    [ "${EDGEINFER_CUDA_REQUIRE:-0}" = 1 ] && exit 1
    exit 0
fi

ARCHS=${EDGEINFER_CUDA_ARCHS:-"75 87 90"}
OUT=${EDGEINFER_CUDA_OUT:-native/cuda/build}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

echo "build_cuda: $("$NVCC" --version | tail -1); archs: $ARCHS"
cmake -S . -B "$OUT/cmake" -DEDGEINFER_CUDA=ON -DCMAKE_CUDA_COMPILER="$(command -v "$NVCC")" \
    -DEDGEINFER_CUDA_ARCHS="$ARCHS" -DEDGEINFER_CUDA_THREADS="${EDGEINFER_CUDA_JOBS:-2}" \
    -DEDGEINFER_PACKAGE_DIR="$OUT" -DPython_EXECUTABLE="$(command -v "${PYTHON:-python3}")" >/dev/null
cmake --build "$OUT/cmake" --target edgeinfer_cuda
if [ -z "${EDGEINFER_CUDA_OUT:-}" ]; then
    cp "$OUT/libedgeinfer_cuda.so" edgeinfer/libedgeinfer_cuda.so
    echo "build_cuda: built $OUT/libedgeinfer_cuda.so (copied to edgeinfer/)"
else
    echo "build_cuda: built $OUT/libedgeinfer_cuda.so"
fi
