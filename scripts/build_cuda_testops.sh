#!/usr/bin/env bash
# Builds libedgeinfer_cuda_testops.so, the library tests/test_cuda.py runs against on a real
# GPU: the backend as shipped (native/cuda/kernels.cu, forward.cu, with the shipped flags) plus
# the test-only single ops (tests/cuda_ops/ops.cu), which the shipped libedgeinfer_cuda.so never
# holds: the cuda-testops preset of CMakePresets.json (target edgeinfer_cuda_testops). Then
#   EDGEINFER_CUDA_LIB=build/cuda_testops/libedgeinfer_cuda_testops.so python -m pytest tests/test_cuda.py
# (scripts/gpu_check.sh does this). Without a GPU, scripts/build_cuda_sim.sh builds the same
# sources for the simulator instead.
#   EDGEINFER_CUDA_ARCHS="90"          archs to build (default "90": the H200)
#   EDGEINFER_CUDA_TESTOPS_OUT=DIR     build folder (default build/cuda_testops)
#   EDGEINFER_CUDA_JOBS=N              nvcc --threads (default 2)
#   NVCC=/path/to/nvcc                 compiler (default: nvcc on PATH, then /usr/local/cuda/bin/nvcc)
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$(command -v "$NVCC" || true)" ] || { echo "build_cuda_testops: nvcc not found (${NVCC:-unset})" >&2; exit 1; }
OUT=${EDGEINFER_CUDA_TESTOPS_OUT:-build/cuda_testops}
cmake --preset cuda-testops -B "$OUT" -DCMAKE_CUDA_COMPILER="$(command -v "$NVCC")" \
    -DEDGEINFER_CUDA_ARCHS="${EDGEINFER_CUDA_ARCHS:-90}" -DEDGEINFER_CUDA_THREADS="${EDGEINFER_CUDA_JOBS:-2}" \
    -DPython_EXECUTABLE="$(command -v "${PYTHON:-python3}")" >/dev/null
cmake --build "$OUT" -j "$(nproc)" --target edgeinfer_cuda_testops
echo "build_cuda_testops: built $OUT/libedgeinfer_cuda_testops.so"
