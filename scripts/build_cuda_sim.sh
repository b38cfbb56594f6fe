#!/usr/bin/env bash
# Builds libedgeinfer_cuda_sim.so: the CUDA backend (native/cuda/kernels.cu and
# forward.cu, unchanged) plus the test-only single ops (tests/cuda_ops/ops.cu),
# compiled as host C++ against eisim, the CPU simulator of the CUDA runtime in
# tests/eisim/. It exports the C API of libedgeinfer_cuda.so and the test ops, so
#   EDGEINFER_CUDA_LIB=build/cuda_sim/libedgeinfer_cuda_sim.so
# runs the CUDA tests (and the engine with device="cuda") on a machine without a
# GPU. Needs only g++ (FMA on x86-64) and python3.
#   EDGEINFER_CUDA_SRC=DIR   the .cu sources (default native/cuda)
#   EDGEINFER_CUDA_SIM_OUT=DIR   output folder (default build/cuda_sim)
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=${EDGEINFER_CUDA_SRC:-native/cuda}
OUT=${EDGEINFER_CUDA_SIM_OUT:-build/cuda_sim}
SIM=tests/eisim
CXX=${CXX:-g++}
PY=${PYTHON:-python3}
# nvcc fuses a*b+c into one FMA by default (-fmad=true), so the simulator does too; that
# needs FMA instructions (always there on aarch64).
FMA=()
if [ "$(uname -m)" = x86_64 ]; then
    grep -qw fma /proc/cpuinfo || { echo "build_cuda_sim: this CPU has no FMA, which eisim needs to fuse multiply-adds as nvcc does" >&2; exit 1; }
    FMA=(-mfma)
fi
# -fsanitize=alignment: a load through a misaligned pointer (a float4 off a 16-byte boundary)
# calls eisim's handler, which fails the launch as a GPU does (cudaErrorMisalignedAddress).
FLAGS=(-std=c++17 -O2 -g -fPIC -ffp-contract=fast "${FMA[@]}" -Wall -Wno-unknown-pragmas -Wno-unused-function
       -I"$SIM"/include -I"$SRC" -Inative/include -Itests/cuda_ops)
DEVICE=(-fsanitize=alignment)
mkdir -p "$OUT/src"
OBJS=()
for cu in "$SRC"/kernels.cu "$SRC"/forward.cu tests/cuda_ops/ops.cu; do
    name=$(basename "${cu%.cu}")
    "$PY" "$SIM"/translate.py "$cu" "$OUT/src/$name.cpp"
    "$CXX" "${FLAGS[@]}" "${DEVICE[@]}" -c "$OUT/src/$name.cpp" -o "$OUT/$name.o" &
    OBJS+=("$OUT/$name.o")
done
"$CXX" "${FLAGS[@]}" -c "$SIM"/eisim.cpp -o "$OUT/eisim.o" &
OBJS+=("$OUT/eisim.o")
for job in $(jobs -p); do wait "$job"; done
"$PY" "$SIM"/translate.py "$SIM"/selftest.cu "$OUT/src/selftest.cpp"
"$CXX" "${FLAGS[@]}" "${DEVICE[@]}" -c "$OUT/src/selftest.cpp" -o "$OUT/selftest.o"
"$CXX" -shared -o "$OUT/libedgeinfer_cuda_sim.so.tmp" "${OBJS[@]}" -lpthread
"$CXX" -shared -o "$OUT/libeisim_selftest.so" "$OUT/selftest.o" "$OUT/eisim.o" -lpthread
mv "$OUT/libedgeinfer_cuda_sim.so.tmp" "$OUT/libedgeinfer_cuda_sim.so"
echo "build_cuda_sim: built $OUT/libedgeinfer_cuda_sim.so (and libeisim_selftest.so, the simulator's own checks)"
