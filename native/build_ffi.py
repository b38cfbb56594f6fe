"""cffi build script (API mode): compiles native/src/*.c into edgeinfer._native_ext.

The declarations come from native/include/edgeinfer.h itself, so the compiler
checks the C API against what Python calls. SIMD kernels are selected at run
time (per-function target attributes + cpuid), never with -march=native.
"""
import glob
import os
import re

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
# edgeinfer.h includes edgeinfer_roles.h; cffi does not follow #include, so it reads both.
HEADERS = [os.path.join(HERE, "include", h) for h in ("edgeinfer_roles.h", "edgeinfer.h")]


def cdef_from_header(path: str) -> str:
    """The header minus preprocessor lines (continued ones included) and C++ guards: what
    cffi can parse."""
    text = open(path, encoding="utf-8").read().replace("\\\n", " ")
    text = re.sub(r"#ifdef __cplusplus.*?#endif", "", text, flags=re.S)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def sources() -> list[str]:
    # Relative paths keep setuptools happy when building in place.
    root = os.path.dirname(HERE)
    return sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(HERE, "src", "*.c")))


ffibuilder = FFI()
ffibuilder.cdef("\n".join(cdef_from_header(h) for h in HEADERS))
ffibuilder.set_source(
    "edgeinfer._native_ext",
    '#include "edgeinfer.h"',
    sources=sources(),
    include_dirs=[os.path.relpath(os.path.join(HERE, "include"), os.path.dirname(HERE)),
                  os.path.relpath(os.path.join(HERE, "src"), os.path.dirname(HERE))],
    extra_compile_args=["-O3", "-std=gnu11", "-fPIC", "-pthread", "-fno-math-errno",
                        "-Wall", "-Wno-unused-function"],
    extra_link_args=["-pthread", "-lm"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
