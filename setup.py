import ctypes.util
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_ext import build_ext

# Everything else lives in pyproject.toml; cffi's build hook needs setup.py.


def _nvcc() -> str | None:
    return shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)


def _cuda_wanted() -> bool:
    """EDGEINFER_CUDA=1: build the CUDA library (an error without nvcc); 0: never.
    Unset: build it when nvcc is here and so is an NVIDIA driver to run it; a
    compiler alone (a CI or build box) is not worth minutes of nvcc per install."""
    flag = os.environ.get("EDGEINFER_CUDA", "")
    if flag in ("0", "1"):
        return flag == "1"
    return bool(_nvcc()) and (bool(ctypes.util.find_library("cuda")) or os.path.exists("/dev/nvidiactl"))


class BuildExtWithCuda(build_ext):
    """The cffi extension, then (when wanted) libedgeinfer_cuda.so via scripts/build_cuda.sh."""

    def run(self):
        super().run()
        if not _cuda_wanted():
            return
        root = os.path.dirname(os.path.abspath(__file__))
        env = dict(os.environ, EDGEINFER_CUDA_REQUIRE=os.environ.get("EDGEINFER_CUDA", "0"))
        subprocess.run(["bash", os.path.join(root, "scripts", "build_cuda.sh")], check=True, env=env, cwd=root)
        built = os.path.join(root, "edgeinfer", "libedgeinfer_cuda.so")
        if not self.inplace and os.path.exists(built):
            shutil.copy(built, os.path.join(self.build_lib, "edgeinfer"))


setup(cffi_modules=["native/build_ffi.py:ffibuilder"], cmdclass={"build_ext": BuildExtWithCuda})
