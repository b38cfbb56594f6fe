#!/usr/bin/env bash
# Proof of the NEON kernels under emulation.
#
# Builds native/tests/kernel_test.c over the native sources for aarch64: the aarch64 preset of
# CMakePresets.json (toolchain cmake/aarch64-linux-gnu.cmake: Debian's gcc-aarch64-linux-gnu,
# static), with the flags the wheel ships (cmake/flags.cmake: Release -O3, no -march: dotprod
# code is chosen at run time from hwcaps), and runs it under qemu-aarch64 twice:
#   -cpu max         has dotprod  -> the vdotq_s32 kernels are dispatched
#   -cpu cortex-a57  no dotprod   -> the plain-NEON kernels are dispatched
# Every NEON kernel is compared with the scalar reference, and a tiny forward is
# compared with native/tests/forward_ref.txt (reference logits from x86).
# Installs the two Debian packages when missing. Exits non-zero on any failure.
#   CC_AARCH64=...     the cross compiler (default aarch64-linux-gnu-gcc)
#   QEMU_AARCH64=...   the emulator (default qemu-aarch64)
#   BUILD_AARCH64=DIR  build folder (default build/aarch64)
set -euo pipefail
cd "$(dirname "$0")/.."

CC=${CC_AARCH64:-aarch64-linux-gnu-gcc}
QEMU=${QEMU_AARCH64:-qemu-aarch64}

if ! command -v "$CC" >/dev/null 2>&1 || ! command -v "$QEMU" >/dev/null 2>&1; then
    echo "test_aarch64: installing gcc-aarch64-linux-gnu and qemu-user"
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq gcc-aarch64-linux-gnu qemu-user >/dev/null
fi

OUT=${BUILD_AARCH64:-build/aarch64}
BIN="$OUT/kernel_test"
echo "test_aarch64: building $BIN with $("$CC" --version | head -1)"
CC_AARCH64="$CC" cmake --preset aarch64 -B "$OUT" -DPython_EXECUTABLE="$(command -v "${PYTHON:-python3}")" >/dev/null
cmake --build "$OUT" -j "$(nproc)" --target kernel_test

pass=0
fail=0
run() { # $1 = qemu cpu, $2 = expected dotprod (1/0)
    local cpu=$1 dp=$2 log="$OUT/kernel_test.$1.log"
    echo "== qemu-aarch64 -cpu $cpu (dotprod expected: $dp) =="
    local rc=0
    "$QEMU" -cpu "$cpu" "$BIN" --ref native/tests/forward_ref.txt --expect-dotprod "$dp" >"$log" 2>&1 || rc=$?
    grep -v '^FAIL' "$log" | sed 's/^/   /' || true
    grep '^FAIL' "$log" | head -20 | sed 's/^/   /' || true
    local line p f
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -1 || true)
    if [ -z "$line" ]; then
        echo "   no result line (exit code $rc): the test program crashed"
        fail=$((fail + 1))
        return
    fi
    p=${line%% passed*}
    f=${line#*passed, }
    f=${f%% failed}
    pass=$((pass + p))
    fail=$((fail + f))
    if [ "$rc" != 0 ] && [ "$f" = 0 ]; then fail=$((fail + 1)); fi
}
run max 1
run cortex-a57 0
echo "test_aarch64: $pass passed, $fail failed"
[ "$fail" = 0 ]
