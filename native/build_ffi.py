"""cffi (API mode): writes the C source of edgeinfer._native_ext.

    python native/build_ffi.py OUT.c

CMakeLists.txt runs this at build time and compiles OUT.c with native/src/*.c
(its flags live there). The declarations come from native/include/edgeinfer.h
itself, so the compiler checks the C API against what Python calls.
"""
import os
import re
import sys

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


ffibuilder = FFI()
ffibuilder.cdef("\n".join(cdef_from_header(h) for h in HEADERS))
ffibuilder.set_source("edgeinfer._native_ext", '#include "edgeinfer.h"')

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUT.c")
    ffibuilder.emit_c_code(sys.argv[1])
