#!/usr/bin/env bash
# Builds libedgeinfer_cuda_testops.so, the library tests/test_cuda.py runs against on a real
# GPU: the backend as shipped (native/cuda/kernels.cu, forward.cu) plus the test-only single
# ops (tests/cuda_ops/ops.cu), which the shipped libedgeinfer_cuda.so never holds. Then
#   EDGEINFER_CUDA_LIB=build/cuda_testops/libedgeinfer_cuda_testops.so python -m pytest tests/test_cuda.py
# (scripts/gpu_check.sh does this). Without a GPU, scripts/build_cuda_sim.sh builds the same
# sources for the simulator instead.
#   EDGEINFER_CUDA_ARCHS="90"          archs to build (default "90": the H200)
#   EDGEINFER_CUDA_TESTOPS_OUT=DIR     output folder (default build/cuda_testops)
#   NVCC=/path/to/nvcc                 compiler (default: nvcc on PATH, then /usr/local/cuda/bin/nvcc)
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$(command -v "$NVCC" || true)" ] || { echo "build_cuda_testops: nvcc not found (${NVCC:-unset})" >&2; exit 1; }
OUT=${EDGEINFER_CUDA_TESTOPS_OUT:-build/cuda_testops}
GENCODE=()
for a in ${EDGEINFER_CUDA_ARCHS:-90}; do GENCODE+=(-gencode "arch=compute_${a},code=sm_${a}"); done
FLAGS=(-std=c++17 -O3 -Xcompiler -fPIC -Inative/cuda -Inative/include -Itests/cuda_ops -Werror all-warnings "${GENCODE[@]}")
mkdir -p "$OUT"
OBJS=()
for cu in native/cuda/kernels.cu native/cuda/forward.cu tests/cuda_ops/ops.cu; do
    o="$OUT/$(basename "${cu%.cu}").o"
    "$NVCC" "${FLAGS[@]}" -c "$cu" -o "$o" &
    OBJS+=("$o")
done
for job in $(jobs -p); do wait "$job"; done
"$NVCC" -shared "${GENCODE[@]}" -cudart static -o "$OUT/libedgeinfer_cuda_testops.so.tmp" "${OBJS[@]}"
mv "$OUT/libedgeinfer_cuda_testops.so.tmp" "$OUT/libedgeinfer_cuda_testops.so"
echo "build_cuda_testops: built $OUT/libedgeinfer_cuda_testops.so"
