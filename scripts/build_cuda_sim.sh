#!/usr/bin/env bash
# Builds libedgeinfer_cuda_sim.so: the CUDA backend (native/cuda/*.cu, unchanged)
# compiled as host C++ against eisim, the CPU simulator of the CUDA runtime in
# native/cuda/sim/. It exports the same C API as libedgeinfer_cuda.so, so
#   EDGEINFER_CUDA_LIB=build/cuda_sim/libedgeinfer_cuda_sim.so
# runs the CUDA tests (and the engine with device="cuda") on a machine without a
# GPU. Needs only g++ and python3.
#   EDGEINFER_CUDA_SRC=DIR   the .cu sources (default native/cuda)
#   EDGEINFER_CUDA_SIM_OUT=DIR   output folder (default build/cuda_sim)
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=${EDGEINFER_CUDA_SRC:-native/cuda}
OUT=${EDGEINFER_CUDA_SIM_OUT:-build/cuda_sim}
CXX=${CXX:-g++}
PY=${PYTHON:-python3}
mkdir -p "$OUT/src"
FLAGS=(-std=c++17 -O2 -g -fPIC -ffp-contract=off -Wall -Wno-unknown-pragmas -Wno-unused-function
       -Inative/cuda/sim/include -I"$SRC" -Inative/include)
OBJS=()
for cu in "$SRC"/kernels.cu "$SRC"/forward.cu "$SRC"/ops.cu; do
    name=$(basename "${cu%.cu}")
    "$PY" native/cuda/sim/translate.py "$cu" "$OUT/src/$name.cpp"
    "$CXX" "${FLAGS[@]}" -c "$OUT/src/$name.cpp" -o "$OUT/$name.o" &
    OBJS+=("$OUT/$name.o")
done
"$CXX" "${FLAGS[@]}" -c native/cuda/sim/eisim.cpp -o "$OUT/eisim.o" &
OBJS+=("$OUT/eisim.o")
for job in $(jobs -p); do wait "$job"; done
"$PY" native/cuda/sim/translate.py native/cuda/sim/selftest.cu "$OUT/src/selftest.cpp"
"$CXX" "${FLAGS[@]}" -c "$OUT/src/selftest.cpp" -o "$OUT/selftest.o"
"$CXX" -shared -o "$OUT/libedgeinfer_cuda_sim.so.tmp" "${OBJS[@]}" -lpthread
"$CXX" -shared -o "$OUT/libeisim_selftest.so" "$OUT/selftest.o" "$OUT/eisim.o" -lpthread
mv "$OUT/libedgeinfer_cuda_sim.so.tmp" "$OUT/libedgeinfer_cuda_sim.so"
echo "build_cuda_sim: built $OUT/libedgeinfer_cuda_sim.so (and libeisim_selftest.so, the simulator's own checks)"
