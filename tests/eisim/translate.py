"""Rewrites a .cu file into host C++ for eisim: the two constructs a C++ compiler
cannot parse, and nothing else (the headers in include/ stand in for CUDA's).

    name<<<grid, block, smem, stream>>>(args)
        -> eisim::kernel("name")(grid, block, smem, stream)(name, args)
    extern __shared__ T name[];
        -> T *name = eisim::dynamic_shared<T>();

Usage: python translate.py IN.cu OUT.cpp
"""
from __future__ import annotations

import re
import sys

LAUNCH = re.compile(r"\b([A-Za-z_]\w*(?:\s*<[^<>;{}]*>)?)\s*<<<(.*?)>>>\s*\(", re.S)
DYNAMIC_SHARED = re.compile(r"extern\s+__shared__\s+(?:__align__\(\d+\)\s*)?([\w:]+)\s+(\w+)\s*\[\s*\]\s*;")


def translate(src: str) -> str:
    def launch(m: re.Match) -> str:
        name = m.group(1)
        label = " ".join(name.split()).replace('"', '\\"')
        return f'eisim::kernel("{label}")({m.group(2)})({name}, '

    out = LAUNCH.sub(launch, src)
    out = DYNAMIC_SHARED.sub(r"\1 *\2 = eisim::dynamic_shared<\1>();", out)
    if "<<<" in out or ">>>" in out:
        raise SystemExit("translate.py: a kernel launch it could not rewrite remains")
    return out


def main(argv: list[str]) -> int:
    src, dst = argv[1], argv[2]
    with open(src, encoding="utf-8") as f:
        text = translate(f.read())
    with open(dst, "w", encoding="utf-8") as f:
        f.write(f'#line 1 "{src}"\n{text}')
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
