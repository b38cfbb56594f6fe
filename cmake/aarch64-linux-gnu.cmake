# Cross build for 64-bit Arm Linux with Debian's gcc-aarch64-linux-gnu (the CMakePresets.json
# "aarch64" preset; scripts/test_aarch64.sh runs the result under qemu-aarch64).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
if(DEFINED ENV{CC_AARCH64})
  set(CMAKE_C_COMPILER "$ENV{CC_AARCH64}")
else()
  set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
endif()
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)   # build tools (python3) run on the host
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
# qemu-aarch64 runs the test programs; static, so they need no aarch64 sysroot at run time.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64)
set(CMAKE_EXE_LINKER_FLAGS_INIT -static)
