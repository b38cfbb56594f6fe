"""cffi (API mode): writes the C source of edgeinfer._native_ext.

    python native/build_ffi.py OUT.c

CMakeLists.txt runs this at build time and compiles OUT.c with native/src/*.c
(its flags live there). The declarations come from native/include/edgeinfer.h
itself, so the compiler checks the C API against what Python calls.
"""
import importlib.util
import os
import sys

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
# edgeinfer.h includes edgeinfer_roles.h; cffi does not follow #include, so it reads both.
HEADERS = [os.path.join(HERE, "include", h) for h in ("edgeinfer_roles.h", "edgeinfer.h")]


def _cdefs():
    """edgeinfer/backends/cdefs.py, loaded by path: the package cannot be imported before its
    extension is built."""
    spec = importlib.util.spec_from_file_location(
        "edgeinfer_cdefs", os.path.join(HERE, "..", "edgeinfer", "backends", "cdefs.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ffibuilder = FFI()
ffibuilder.cdef("\n".join(_cdefs().cdef_from_header(h) for h in HEADERS))
ffibuilder.set_source("edgeinfer._native_ext", '#include "edgeinfer.h"')

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUT.c")
    ffibuilder.emit_c_code(sys.argv[1])
