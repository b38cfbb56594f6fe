from setuptools import setup

# Everything else lives in pyproject.toml; cffi's build hook needs setup.py.
setup(cffi_modules=["native/build_ffi.py:ffibuilder"])
