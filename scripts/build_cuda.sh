#!/usr/bin/env bash
# Builds the CUDA backend, libedgeinfer_cuda.so, alone: the cuda preset of CMakePresets.json
# (target edgeinfer_cuda, the one `EDGEINFER_CUDA=1 pip install .` builds), with real cubins for
# sm_75 (T4), sm_87 (Jetson Orin) and sm_90 (H200), in build/cuda/, into edgeinfer/ (the package
# directory, where edgeinfer.backends.cuda loads it from; $EDGEINFER_CUDA_LIB wins).
#
# Without nvcc it prints why and exits 0, so CPU-only machines and CI without
# CUDA pass; with nvcc a compile error fails (exit != 0).
#   EDGEINFER_CUDA_ARCHS="75"   build only these archs (default "75 87 90"; for iterating)
#   NVCC=/path/to/nvcc          compiler (default: nvcc on PATH, then /usr/local/cuda/bin/nvcc)
#   EDGEINFER_CUDA_REQUIRE=1    a missing nvcc is an error (exit 1) instead of a skip
#   EDGEINFER_CUDA_OUT=DIR      build in DIR/cmake, the library into DIR (not edgeinfer/; used by tests)
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
echo "build_cuda: $("$NVCC" --version | tail -1); archs: $ARCHS"
ARGS=(-DCMAKE_CUDA_COMPILER="$(command -v "$NVCC")" -DEDGEINFER_CUDA_ARCHS="$ARCHS"
      -DEDGEINFER_CUDA_THREADS="${EDGEINFER_CUDA_JOBS:-2}" -DPython_EXECUTABLE="$(command -v "${PYTHON:-python3}")")
if [ -n "${EDGEINFER_CUDA_OUT:-}" ]; then
    mkdir -p "$EDGEINFER_CUDA_OUT"
    OUT=$(cd "$EDGEINFER_CUDA_OUT" && pwd)
    cmake --preset cuda -B "$OUT/cmake" -DEDGEINFER_PACKAGE_DIR="$OUT" "${ARGS[@]}" >/dev/null
    cmake --build "$OUT/cmake" --target edgeinfer_cuda
else
    OUT=edgeinfer
    cmake --preset cuda "${ARGS[@]}" >/dev/null
    cmake --build --preset cuda
fi
echo "build_cuda: built $OUT/libedgeinfer_cuda.so"
