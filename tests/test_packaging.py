"""What the core install (`pip install edgeinfer`, no extras) must give, and the one version.

The server stack (aiohttp, pydantic, prometheus-client) is the [server] extra: the engine, the
CLI and `edgeinfer run` must work without it, and `edgeinfer serve` must say which extra to
install. Each check runs in a fresh interpreter in which importing those modules fails, as
it does where they are not installed. typer (core: the CLI) parses options with pydantic, so
pydantic is installed with the core anyway; only edgeinfer's own imports must not need it.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import edgeinfer
from edgeinfer._native import ffi, lib

SERVER_STACK = ("aiohttp", "pydantic", "prometheus_client")
NOT_WITH_TYPER = ("aiohttp", "prometheus_client")


def _without(modules: tuple[str, ...]) -> str:
    """Code that makes importing `modules` fail: a meta path finder ahead of every other."""
    return textwrap.dedent(f"""
        import importlib.abc, sys

        class _NotInstalled(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.partition(".")[0] in {modules!r}:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None

        sys.meta_path.insert(0, _NotInstalled())
    """)


def _run_core(body: str, missing: tuple[str, ...] = NOT_WITH_TYPER) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _without(missing) + textwrap.dedent(body)],
                          capture_output=True, text=True, timeout=120)


def _cli(*args: str) -> str:
    return f"""
        sys.argv = ["edgeinfer", *{list(args)!r}]
        from edgeinfer.cli import app
        app()
    """


@pytest.mark.slow   # fresh interpreters
def test_the_core_install_imports_and_runs_without_the_server_stack():
    r = _run_core("""
        import edgeinfer, edgeinfer.cli, edgeinfer.engine
        print(sorted(m for m in sys.modules if m.partition(".")[0] in %r))
    """ % (SERVER_STACK,), missing=SERVER_STACK)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
    for args in (["--help"], ["run", "--help"]):
        r = _run_core(_cli(*args))
        assert r.returncode == 0, f"edgeinfer {' '.join(args)}: {r.stderr}"
        assert "Usage" in r.stdout


@pytest.mark.slow
def test_serve_without_the_server_extra_names_it():
    r = _run_core(_cli("serve", "no-such-model.gguf"))
    assert r.returncode == 1
    assert "pip install 'edgeinfer[server]'" in r.stderr and "Traceback" not in r.stderr


def test_the_native_library_and_the_package_have_one_version():
    """edgeinfer/_version.py is the one place: CMake compiles it into ei_version()."""
    assert ffi.string(lib.ei_version()).decode() == edgeinfer.__version__
