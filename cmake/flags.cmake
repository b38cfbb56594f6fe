# The one flag set: every target that compiles edgeinfer's C or CUDA sources, shipped or test,
# takes its flags from here.

# C (native/src, the cffi wrapper, native/tests). SIMD kernels use per-function target
# attributes and are chosen at run time (cpuid / hwcaps): never -march=native, so one build runs
# on every CPU of its architecture. -fwrapv because every CPython extension build has had it
# (CPython's own CFLAGS) and the kernels were tested so. Optimisation: CMAKE_BUILD_TYPE
# (Release: -O3 -DNDEBUG, the default of CMakeLists.txt and every preset). -falign-functions=64:
# every kernel starts on a cache line, so its loops' placement does not move with unrelated code
# above it (an unchanged AVX2 IQ4_XS kernel ran 0.95x after the code before it grew, its rate back
# with this; the AVX-512 Q4_K / Q6_K / Q4_0 / Q8_0 kernels 0.98-1.03x, scripts/bench_matvec.py).
set(CMAKE_C_STANDARD 11)     # with CMAKE_C_EXTENSIONS: -std=gnu11 on every C target
set(CMAKE_C_STANDARD_REQUIRED ON)
set(CMAKE_C_EXTENSIONS ON)
add_library(edgeinfer_flags INTERFACE)
target_compile_options(edgeinfer_flags INTERFACE
  $<$<COMPILE_LANGUAGE:C>:-fno-math-errno -fwrapv -falign-functions=64 -pthread -Wall -Wno-unused-function>)
target_compile_definitions(edgeinfer_flags INTERFACE EI_VERSION="${EDGEINFER_VERSION}")
target_include_directories(edgeinfer_flags INTERFACE
  "${PROJECT_SOURCE_DIR}/native/include" "${PROJECT_SOURCE_DIR}/native/src")
target_link_options(edgeinfer_flags INTERFACE -pthread)
target_link_libraries(edgeinfer_flags INTERFACE m)

# native/cuda, whether nvcc compiles it (edgeinfer_cuda, edgeinfer_cuda_testops) or the host
# C++ compiler does for the simulator (edgeinfer_cuda_sim).
add_library(edgeinfer_cuda_sources INTERFACE)
target_compile_definitions(edgeinfer_cuda_sources INTERFACE EI_VERSION="${EDGEINFER_VERSION}")
target_include_directories(edgeinfer_cuda_sources INTERFACE
  "${PROJECT_SOURCE_DIR}/native/cuda" "${PROJECT_SOURCE_DIR}/native/include")

set(EDGEINFER_CUDA_THREADS 2 CACHE STRING "nvcc --threads: architectures compiled in parallel")

# nvcc's flags for a library of native/cuda (shipped or with the test ops): C++17, every warning
# an error, the static CUDA runtime (only the driver, libcuda, is needed at run time).
function(edgeinfer_cuda_flags target)
  target_link_libraries(${target} PRIVATE edgeinfer_cuda_sources)
  target_compile_options(${target} PRIVATE "--threads=${EDGEINFER_CUDA_THREADS}" -Werror=all-warnings)
  set_target_properties(${target} PROPERTIES
    CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
    CUDA_RUNTIME_LIBRARY Static)
endfunction()
