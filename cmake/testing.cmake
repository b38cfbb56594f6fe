# Test builds (EDGEINFER_TESTING=ON): never installed, so none of this reaches the wheel.
# Each compiles the shipped sources with the shipped flags (flags.cmake).

# native/tests/kernel_test.c over the objects of the extension: every SIMD kernel against its
# scalar reference, and a tiny forward against reference logits. scripts/test_aarch64.sh builds
# it for aarch64 (cmake/aarch64-linux-gnu.cmake) and runs it under qemu.
add_executable(kernel_test native/tests/kernel_test.c)
target_link_libraries(kernel_test PRIVATE edgeinfer_core edgeinfer_flags)

# The backend as shipped plus the test-only single ops (tests/cuda_ops), for tests/test_cuda.py
# on a real GPU (scripts/gpu_check.sh).
if(_build_cuda)
  add_library(edgeinfer_cuda_testops SHARED ${EDGEINFER_CUDA_SOURCES} tests/cuda_ops/ops.cu)
  edgeinfer_cuda_flags(edgeinfer_cuda_testops)
  target_include_directories(edgeinfer_cuda_testops PRIVATE tests/cuda_ops)
endif()

# eisim (tests/eisim): native/cuda and the test ops compiled as host C++ against a CPU
# simulator of the CUDA runtime, so the CUDA tests run without a GPU (docs/cuda.md).
if(NOT CMAKE_CROSSCOMPILING)
  enable_language(CXX)
  set(CMAKE_CXX_EXTENSIONS OFF)  # -std=c++17
  set(EDGEINFER_CUDA_SIM_SRC "${PROJECT_SOURCE_DIR}/native/cuda" CACHE PATH
      "The .cu sources the simulator library is built from (a test builds a modified copy)")
  set(_sim "${PROJECT_SOURCE_DIR}/tests/eisim")

  # nvcc fuses a*b+c into one FMA by default (-fmad=true), so the simulator does too; that needs
  # FMA instructions (always there on aarch64).
  set(_fma "")
  if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
    file(READ /proc/cpuinfo _cpuinfo)
    if(NOT _cpuinfo MATCHES "[ \t]fma[ \t\n]")
      message(FATAL_ERROR "eisim: this CPU has no FMA, which the simulator needs to fuse multiply-adds as nvcc does")
    endif()
    set(_fma -mfma)
  endif()
  add_library(eisim_flags INTERFACE)
  target_compile_features(eisim_flags INTERFACE cxx_std_17)
  target_compile_options(eisim_flags INTERFACE -O2 -g -ffp-contract=fast ${_fma}
                         -Wall -Wno-unknown-pragmas -Wno-unused-function)
  target_include_directories(eisim_flags INTERFACE "${_sim}/include" "${PROJECT_SOURCE_DIR}/tests/cuda_ops")

  add_library(eisim_runtime OBJECT "${_sim}/eisim.cpp")
  target_link_libraries(eisim_runtime PUBLIC eisim_flags)
  set_target_properties(eisim_runtime PROPERTIES POSITION_INDEPENDENT_CODE ON)

  # translate.py rewrites the two constructs C++ cannot parse (kernel launches, extern __shared__).
  file(MAKE_DIRECTORY "${CMAKE_BINARY_DIR}/eisim_src")
  function(eisim_translate out_var)
    set(_out "")
    foreach(_cu IN LISTS ARGN)
      get_filename_component(_name "${_cu}" NAME_WE)
      set(_cpp "${CMAKE_BINARY_DIR}/eisim_src/${_name}.cpp")
      add_custom_command(
        OUTPUT "${_cpp}"
        COMMAND Python::Interpreter "${_sim}/translate.py" "${_cu}" "${_cpp}"
        DEPENDS "${_cu}" "${_sim}/translate.py"
        VERBATIM)
      list(APPEND _out "${_cpp}")
    endforeach()
    set(${out_var} "${_out}" PARENT_SCOPE)
  endfunction()

  # Device code: -fsanitize=alignment sends a load through a misaligned pointer (a float4 off a
  # 16-byte boundary) to eisim's handler, which fails the launch as a GPU does.
  function(eisim_device_library target)
    add_library(${target} SHARED ${ARGN} $<TARGET_OBJECTS:eisim_runtime>)
    target_link_libraries(${target} PRIVATE eisim_flags Threads::Threads)
    target_compile_options(${target} PRIVATE -fsanitize=alignment)
  endfunction()
  find_package(Threads REQUIRED)

  eisim_translate(_sim_cpp "${EDGEINFER_CUDA_SIM_SRC}/kernels.cu" "${EDGEINFER_CUDA_SIM_SRC}/forward.cu"
                  "${PROJECT_SOURCE_DIR}/tests/cuda_ops/ops.cu")
  eisim_device_library(edgeinfer_cuda_sim ${_sim_cpp})
  # quoted includes of a modified copy resolve in that copy first
  target_include_directories(edgeinfer_cuda_sim BEFORE PRIVATE "${EDGEINFER_CUDA_SIM_SRC}")
  target_link_libraries(edgeinfer_cuda_sim PRIVATE edgeinfer_cuda_sources)

  # The simulator's own checks: kernels that each break one CUDA rule (tests/test_cuda_sim.py).
  eisim_translate(_selftest_cpp "${_sim}/selftest.cu")
  eisim_device_library(eisim_selftest ${_selftest_cpp})
endif()
