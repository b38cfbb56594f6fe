"""The instruction-set levels the kernel tests run, and a record of the levels they ran.

A kernel test runs each SIMD level the CPU has against the scalar reference. A level the CPU
has but no passing test ran means untested shipped code, so tests/conftest.py reports the
levels at the end of the run and, in strict mode, fails a whole-suite run that missed one.
A level the CPU lacks is reported as such: its kernels are not tested on this machine
(NEON's run under qemu in scripts/test_aarch64.sh).
"""
from __future__ import annotations

from collections.abc import Iterator

from edgeinfer._native import lib

NAMES = {lib.EI_ISA_SCALAR: "scalar", lib.EI_ISA_AVX2: "avx2", lib.EI_ISA_AVX512: "avx512",
         lib.EI_ISA_NEON: "neon"}
LEVELS = {name: level for level, name in NAMES.items()}

# levels the test now running has run; the conftest hook keeps them if the test passes
running: set[str] = set()
# levels that passing tests ran
exercised: set[str] = set()


def on_cpu() -> list[int]:
    """The levels this CPU can run, scalar first."""
    return [level for level in NAMES if lib.ei_isa_supported(level)]


def each_level(levels: list[int] | None = None) -> Iterator[int]:
    """Yields each level (default: every level the CPU has), recording it as run."""
    for level in on_cpu() if levels is None else levels:
        running.add(NAMES[level])
        yield level


def name_of(isa: int | str) -> str:
    return isa if isinstance(isa, str) else NAMES[isa]
