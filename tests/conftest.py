"""Shared fixtures: the real models, SmolLM2-135M-Instruct Q4_1 and Gemma 3 270M Q4_K_M (strict mode:
tests/support/strict.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """Path of the cached default model, fetched (and sha256-verified) on first use."""
    from edgeinfer.hub import DEFAULT_MODEL, ensure_model

    return ensure_model(DEFAULT_MODEL, progress=False)


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    """Path of the cached real Gemma 3 270M Q4_K_M file, fetched (and sha256-verified) on first use."""
    from edgeinfer.hub import ensure_model

    return ensure_model("gemma3-270m", progress=False)


# ---- the instruction-set levels the kernel tests ran (tests/support/isa.py) ----
KERNEL_TEST_FILES = ("test_kernels.py", "test_forward_kernels.py", "test_deltanet_kernels.py")


def pytest_runtest_setup(item):
    from tests.support import isa
    isa.running.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if call.when != "call" or not report.passed:
        return
    from tests.support import isa
    isa.exercised |= isa.running
    param = item.callspec.params.get("isa") if hasattr(item, "callspec") else None
    if isinstance(param, (int, str)) and isa.name_of(param) in isa.LEVELS:
        isa.exercised.add(isa.name_of(param))


def _isa_levels_missed(session) -> list[str] | None:
    """The levels the CPU has that no passing test ran, when every kernel test was selected."""
    opt = session.config.option
    files = {Path(str(item.fspath)).name for item in session.items}
    if opt.keyword or opt.markexpr or not set(KERNEL_TEST_FILES) <= files:
        return None
    from tests.support import isa
    return [isa.NAMES[level] for level in isa.on_cpu() if isa.NAMES[level] not in isa.exercised]


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    from tests.support.strict import strict
    missed = _isa_levels_missed(session)
    session.config._isa_missed = missed
    if missed and strict() and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    try:
        from tests.support import isa
    except Exception:   # noqa: BLE001 - the native library did not load: the tests say why
        return
    have = [isa.NAMES[level] for level in isa.on_cpu()]
    lacks = [name for name in isa.LEVELS if name not in have]
    terminalreporter.write_line(
        f"kernel ISA levels run: {', '.join(sorted(isa.exercised)) or 'none'}; this CPU has "
        f"{', '.join(have)}" + (f"; lacks {', '.join(lacks)} (not tested here)" if lacks else ""))
    missed = getattr(config, "_isa_missed", None)
    if missed:
        terminalreporter.write_line(
            f"FAILED: kernel ISA levels the CPU has but no passing kernel test ran: {', '.join(missed)}"
            " (strict mode fails the run)", red=True)
