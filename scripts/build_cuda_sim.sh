#!/usr/bin/env bash
# Builds libedgeinfer_cuda_sim.so: the CUDA backend (native/cuda/kernels.cu and forward.cu,
# unchanged) plus the test-only single ops (tests/cuda_ops/ops.cu), compiled as host C++
# against eisim, the CPU simulator of the CUDA runtime in tests/eisim/: the cuda-sim preset of
# CMakePresets.json (targets edgeinfer_cuda_sim and eisim_selftest, cmake/testing.cmake). It
# exports the C API of libedgeinfer_cuda.so and the test ops, so
#   EDGEINFER_CUDA_LIB=build/cuda_sim/libedgeinfer_cuda_sim.so
# runs the CUDA tests (and the engine with device="cuda") on a machine without a GPU.
# Needs only cmake, g++ (FMA on x86-64) and python3.
#   EDGEINFER_CUDA_SRC=DIR       the .cu sources (default native/cuda)
#   EDGEINFER_CUDA_SIM_OUT=DIR   build folder (default build/cuda_sim)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${EDGEINFER_CUDA_SIM_OUT:-build/cuda_sim}
SRC=$(cd "${EDGEINFER_CUDA_SRC:-native/cuda}" && pwd)
cmake --preset cuda-sim -B "$OUT" -DEDGEINFER_CUDA_SIM_SRC="$SRC" \
    -DPython_EXECUTABLE="$(command -v "${PYTHON:-python3}")" >/dev/null
cmake --build "$OUT" -j "$(nproc)" --target edgeinfer_cuda_sim eisim_selftest
echo "build_cuda_sim: built $OUT/libedgeinfer_cuda_sim.so (and libeisim_selftest.so, the simulator's own checks)"
