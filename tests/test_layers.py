"""The package's layers: every import points down (docs/architecture.md draws them).

Parsed from the source (lazy imports inside functions count too), so a module
that reaches past its layer fails here before anyone notices the tangle.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "edgeinfer"

# Each unit of the package and the units it may import. Read bottom-up: a unit
# sees only what is listed, never a unit above it. `_native` (the door into C)
# is opened only by the layers that hand data to C: model, backends, convert.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "arch": {"errors"},
    "_native": {"errors"},
    "gguf": {"errors"},
    "progress": set(),
    "hub": {"errors", "progress"},
    "text": {"errors", "gguf"},
    "model": {"errors", "arch", "gguf", "_native"},
    "convert": {"errors", "arch", "gguf", "text", "progress", "_native"},
    "backends": {"errors", "arch", "gguf", "model", "_native"},
    "engine": {"errors", "arch", "gguf", "hub", "text", "model", "backends"},
    "server": {"errors", "hub", "engine"},
    "tools": {"errors", "arch", "gguf", "hub", "progress", "text", "model", "backends", "convert", "engine"},
    "cli": {"errors", "hub", "progress", "convert", "engine", "server", "tools"},
}
TOP = {"__init__", "__main__"}     # the public face: `edgeinfer.load` and `python -m edgeinfer`


def _unit(module: str, root: Path = PACKAGE) -> str:
    """edgeinfer.engine.scheduler -> engine; edgeinfer.hub -> hub; edgeinfer.load -> __init__."""
    parts = module.split(".")
    if len(parts) < 2:
        return "__init__"
    if parts[1] == "_native_ext":
        return "_native"       # the compiled half of the door
    if (root / parts[1]).is_dir() or (root / f"{parts[1]}.py").exists():
        return parts[1]
    return "__init__"          # a name defined in edgeinfer/__init__.py


def _imports(path: Path, root: Path = PACKAGE) -> list[tuple[int, str]]:
    """(line, absolute module) of every edgeinfer import in a file, lazy ones included."""
    package = list(path.relative_to(root.parent).with_suffix("").parts[:-1])
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    # `if TYPE_CHECKING:` imports are annotations only: they never run
    typing_only = {id(n) for node in ast.walk(tree)
                   if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                   for n in ast.walk(node)}
    out = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "edgeinfer"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "edgeinfer":
                continue
            if target == "edgeinfer" or target.count(".") == 0:
                # `from .. import load` / `from . import plan`: name the imported submodules
                out += [(node.lineno, f"{target}.{a.name}") for a in node.names]
            else:
                out.append((node.lineno, target))
    return out


def test_every_import_points_down():
    assert _wrong_imports(PACKAGE) == []


def _wrong_imports(root: Path) -> list[str]:
    wrong = []
    for f in sorted(root.rglob("*.py")):
        me = _unit(".".join(f.relative_to(root.parent).with_suffix("").parts), root)
        if me in TOP:
            continue
        if me not in ALLOWED:
            wrong.append(f"{f.relative_to(root.parent)}: {me} has no place in the layers")
            continue
        for line, target in _imports(f, root):
            them = _unit(target, root)
            # `edgeinfer.load` (the top) is for the cli only; everything else imports the Engine
            if them == me or them in ALLOWED[me] or (them == "__init__" and me == "cli"):
                continue
            wrong.append(f"{f.relative_to(root.parent)}:{line} {me} -> {target}")
    return wrong


def test_engine_modules_have_no_import_cycle():
    """The engine's modules form a tree: the scheduler never imports the Engine, and so on."""
    graph = {}
    for f in sorted((PACKAGE / "engine").glob("*.py")):
        me = "edgeinfer.engine." + f.stem
        graph[me] = {m for _, target in _imports(f) for m in (target, target.rsplit(".", 1)[0])
                     if m.startswith("edgeinfer.engine.") and m != me}

    def reachable(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for d in graph.get(todo.pop(), set()) - seen:
                seen.add(d)
                todo.append(d)
        return seen

    assert "edgeinfer.engine.scheduler" in reachable("edgeinfer.engine.engine")   # the scan sees imports
    assert [m for m in graph if m in reachable(m)] == []


def test_the_checker_sees_a_wrong_import(tmp_path):
    """The rule is not vacuous: upward imports, lazy and relative, are found; downward ones pass."""
    root = tmp_path / "edgeinfer"
    for d in ("gguf", "engine", "cli"):
        (root / d).mkdir(parents=True)
    (root / "__init__.py").write_text("def load(): ...\n")
    (root / "engine" / "engine.py").write_text("from ..gguf import reader\n")
    (root / "gguf" / "reader.py").write_text("def f():\n    from ..engine.engine import Engine\n    from .. import load\n")
    (root / "cli" / "main.py").write_text("from .. import load\nfrom ..engine import engine\n")
    assert _wrong_imports(root) == ["edgeinfer/gguf/reader.py:2 gguf -> edgeinfer.engine.engine",
                                    "edgeinfer/gguf/reader.py:3 gguf -> edgeinfer.load"]
