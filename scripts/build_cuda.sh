#!/usr/bin/env bash
# Builds the CUDA backend, libedgeinfer_cuda.so, with real cubins for sm_75 (T4),
# sm_87 (Jetson Orin) and sm_90 (H200), into native/cuda/build/ and a copy in
# edgeinfer/ (where edgeinfer.backends.cuda looks for it; $EDGEINFER_CUDA_LIB wins).
#
# Without nvcc it prints why and exits 0, so CPU-only machines and CI without
# CUDA pass; with nvcc a compile error fails (exit != 0).
#   EDGEINFER_CUDA_ARCHS="75"   build only these archs (default "75 87 90"; for iterating)
#   NVCC=/path/to/nvcc          compiler (default: nvcc on PATH, then /usr/local/cuda/bin/nvcc)
#   EDGEINFER_CUDA_REQUIRE=1    a missing nvcc is an error (exit 1) instead of a skip
#   EDGEINFER_CUDA_OUT=DIR      build into DIR only (no copy into edgeinfer/; used by tests)
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
GENCODE=()
for a in $ARCHS; do GENCODE+=(-gencode "arch=compute_${a},code=sm_${a}"); done

OUT=${EDGEINFER_CUDA_OUT:-native/cuda/build}
mkdir -p "$OUT"
SRCS=(native/cuda/kernels.cu native/cuda/forward.cu native/cuda/ops.cu)
FLAGS=(-std=c++17 -O3 -Xcompiler -fPIC -Inative/cuda -Inative/include
       --threads "${EDGEINFER_CUDA_JOBS:-2}" -Werror all-warnings "${GENCODE[@]}")

echo "build_cuda: $("$NVCC" --version | tail -1); archs: $ARCHS"
OBJS=()
for s in "${SRCS[@]}"; do
    o="$OUT/$(basename "${s%.cu}").o"
    "$NVCC" "${FLAGS[@]}" -c "$s" -o "$o"
    OBJS+=("$o")
done
# The CUDA runtime is linked statically: the library needs only the driver (libcuda) at run time.
"$NVCC" -shared "${GENCODE[@]}" -cudart static -o "$OUT/libedgeinfer_cuda.so.tmp" "${OBJS[@]}"
mv "$OUT/libedgeinfer_cuda.so.tmp" "$OUT/libedgeinfer_cuda.so"
if [ -z "${EDGEINFER_CUDA_OUT:-}" ]; then
    cp "$OUT/libedgeinfer_cuda.so" edgeinfer/libedgeinfer_cuda.so
    echo "build_cuda: built $OUT/libedgeinfer_cuda.so (copied to edgeinfer/)"
else
    echo "build_cuda: built $OUT/libedgeinfer_cuda.so"
fi
