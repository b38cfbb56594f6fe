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
    "_version": set(),     # the version string, read by pyproject.toml and CMakeLists.txt too
    "arch": {"errors"},
    "_native": {"errors"},
    "gguf": {"errors"},
    "progress": set(),
    "hub": {"errors", "progress"},
    "text": {"errors", "gguf"},
    "model": {"errors", "arch", "gguf", "_native"},
    "convert": {"errors", "arch", "gguf", "text", "progress", "_native"},
    "backends": {"errors", "arch", "gguf", "model", "_native"},
    # engine -> convert: a PEFT adapter folder becomes GGUF-named pairs when a server loads it
    "engine": {"errors", "arch", "gguf", "hub", "text", "model", "backends", "convert"},
    "server": {"errors", "hub", "engine"},
    "tools": {"errors", "arch", "gguf", "hub", "progress", "text", "model", "backends", "convert", "engine"},
    "cli": {"errors", "hub", "progress", "convert", "engine", "server", "tools"},
}
TOP = {"__init__", "__main__"}     # the public face: `edgeinfer.load` and `python -m edgeinfer`
# Units that see the engine only through `edgeinfer.engine` (its __init__ re-exports the Engine
# and the values its public methods trade in), never through a submodule.
ENGINE_CLIENTS = {"server", "tools"}


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


def _imports(path: Path, root: Path = PACKAGE, typing_too: bool = False) -> list[tuple[int, str]]:
    """(line, absolute module) of every edgeinfer import in a file, lazy ones included, and with
    `typing_too` those under `if TYPE_CHECKING:` (annotations only: they never run)."""
    package = list(path.relative_to(root.parent).with_suffix("").parts[:-1])
    if path.name == "__init__.py":
        package.append(path.parent.name)   # a package's relative imports start at itself
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    typing_only = set() if typing_too else {
        id(n) for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
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
            if me in ENGINE_CLIENTS and them == "engine" and target != "edgeinfer.engine":
                wrong.append(f"{f.relative_to(root.parent)}:{line} {me} -> {target} (use edgeinfer.engine)")
                continue
            if them == me or them in ALLOWED[me] or (them == "__init__" and me == "cli"):
                continue
            wrong.append(f"{f.relative_to(root.parent)}:{line} {me} -> {target}")
    return wrong


def _module_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, type-only imports included. A package is its
    __init__; importing a submodule runs its parent package first, but that is no edge."""
    files = {".".join(f.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__"): f
             for f in sorted(root.rglob("*.py"))}
    graph = {}
    for me, f in files.items():
        deps = set()
        for _, target in _imports(f, root, typing_too=True):
            # `from pkg.mod import name`: the module; `from pkg import mod`: the submodule
            module = target if target in files else target.rsplit(".", 1)[0]
            if module in files and module != me:
                deps.add(module)
        graph[me] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every module that reaches itself through its imports."""
    def reachable(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for d in graph.get(todo.pop(), set()) - seen:
                seen.add(d)
                todo.append(d)
        return seen

    return [m for m in graph if m in reachable(m)]


def test_no_import_cycle():
    """The package's modules form a tree, type-only imports included: the scheduler never
    imports the Engine, bench never imports its worker process, and so on."""
    graph = _module_graph()
    assert "edgeinfer.engine.scheduler" in graph["edgeinfer.engine.engine"]   # the scan sees imports
    assert _cycles(graph) == []


def test_the_cycle_check_sees_a_type_only_circle(tmp_path):
    root = tmp_path / "edgeinfer"
    (root / "engine").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "engine" / "__init__.py").write_text("from .a import A\n")
    (root / "engine" / "a.py").write_text("from .b import B\n")
    (root / "engine" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import A\n")
    (root / "engine" / "c.py").write_text("from . import b\n")
    assert sorted(_cycles(_module_graph(root))) == ["edgeinfer.engine.a", "edgeinfer.engine.b"]


def test_the_checker_sees_a_wrong_import(tmp_path):
    """The rule is not vacuous: upward imports, lazy and relative, are found; downward ones pass."""
    root = tmp_path / "edgeinfer"
    for d in ("gguf", "engine", "cli"):
        (root / d).mkdir(parents=True)
    (root / "__init__.py").write_text("def load(): ...\n")
    (root / "engine" / "engine.py").write_text("from ..gguf import reader\n")
    (root / "gguf" / "reader.py").write_text("def f():\n    from ..engine.engine import Engine\n    from .. import load\n")
    (root / "cli" / "main.py").write_text("from .. import load\nfrom ..engine import engine\n")
    (root / "server").mkdir()
    (root / "server" / "app.py").write_text("from ..engine import Engine\nfrom ..engine.scheduler import X\n")
    assert _wrong_imports(root) == ["edgeinfer/gguf/reader.py:2 gguf -> edgeinfer.engine.engine",
                                    "edgeinfer/gguf/reader.py:3 gguf -> edgeinfer.load",
                                    "edgeinfer/server/app.py:2 server -> edgeinfer.engine.scheduler (use edgeinfer.engine)"]
