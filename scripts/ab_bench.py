#!/usr/bin/env python3
"""A/B speed of two source trees of edgeinfer on the same files, interleaved.

Each tree must hold a built native library (`cmake -S TREE -B TREE/build/dev && cmake --build
TREE/build/dev`; `git worktree add DIR COMMIT` makes a tree of another commit). Every round
runs `edgeinfer bench FILE --json` once per tree, in a fresh process each, alternating which
tree goes first, so both see the same machine load. A process imports edgeinfer from its tree
even where another tree is pip-installed in editable mode (that install's import hook is
removed in the child).

    python scripts/ab_bench.py --a /tmp/base --b . FILE [FILE ...] [--rounds 6] [-- BENCH ARGS]

Prints per file the median prefill and decode (and, with --ctx-depth, decode at that depth) tokens/s of each tree and the ratio b / a of
the medians, with the per-round ratios' range.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# The child's sitecustomize: drop the editable install's finder so PYTHONPATH decides.
_SITECUSTOMIZE = ("import sys\n"
                  "sys.meta_path[:] = [f for f in sys.meta_path "
                  "if 'ScikitBuild' not in type(f).__name__]\n")


def bench_once(tree: Path, model: str, bench_args: list[str], hook_dir: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([hook_dir, str(tree)]))
    cmd = [sys.executable, "-m", "edgeinfer", "bench", model, "--json", "-q", *bench_args]
    out = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{tree}: bench failed ({out.returncode}):\n{out.stderr[-2000:]}")
    run = json.loads(out.stdout)["runs"][0]
    got = {"pp": run["pp"]["tokens_per_s"]["median"], "tg": run["tg"]["tokens_per_s"]["median"]}
    if run.get("tg_depth"):   # with --ctx-depth
        got["tg_depth"] = run["tg_depth"]["tokens_per_s"]["median"]
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", type=Path, required=True, help="the reference tree")
    ap.add_argument("--b", type=Path, required=True, help="the tree measured against it")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("models", nargs="+")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = ap.parse_args(argv[:cut])
    bench_args = argv[cut + 1:] or ["--threads", "2", "--reps", "1", "--no-isolated-rss"]
    trees = {"a": args.a.resolve(), "b": args.b.resolve()}
    with tempfile.TemporaryDirectory() as hook_dir:
        Path(hook_dir, "sitecustomize.py").write_text(_SITECUSTOMIZE)
        for model in args.models:
            got: dict[str, list[dict]] = {"a": [], "b": []}
            for r in range(args.rounds):
                for side in ("a", "b") if r % 2 == 0 else ("b", "a"):
                    got[side].append(bench_once(trees[side], model, bench_args, hook_dir))
            print(f"{Path(model).name}: {args.rounds} rounds, a={trees['a']}, b={trees['b']}")
            for metric, name in (("pp", "prefill"), ("tg", "decode"), ("tg_depth", "at depth")):
                if metric not in got["a"][0]:
                    continue
                a = [g[metric] for g in got["a"]]
                b = [g[metric] for g in got["b"]]
                per_round = [y / x for x, y in zip(a, b)]
                print(f"  {name:8s} a {statistics.median(a):8.1f} t/s  b {statistics.median(b):8.1f} t/s"
                      f"  b/a {statistics.median(b) / statistics.median(a):.3f}"
                      f"  (rounds {min(per_round):.3f}-{max(per_round):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
