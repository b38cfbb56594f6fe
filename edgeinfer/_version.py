"""The package version: the one place it is written (pyproject.toml and CMakeLists.txt read it)."""
__version__ = "0.1.0"
