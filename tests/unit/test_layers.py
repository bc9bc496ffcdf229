"""The package layout's rules, checked on the source: no import circle inside a package
(``TYPE_CHECKING`` imports included: a circle hidden from the interpreter is still one to a
reader), and no private name (``_x``) imported from another module."""

from __future__ import annotations

import ast
from pathlib import Path

import airfs

ROOT = Path(airfs.__file__).parent


def _modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        rel = p.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, list[str]]]:
    """(module imported, names taken from it) for every import in ``path``."""
    is_pkg = path.name == "__init__.py"
    pkg = name if is_pkg else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            names = [a.name for a in node.names]
            for n in names:  # ``from . import x`` imports the module ``x``
                if f"{target}.{n}" in modules:
                    out.append((f"{target}.{n}", []))
            out.append((target, names))
        elif isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
    return out


def test_no_import_circle_inside_a_package() -> None:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps = set()
        for target, _ in _imports(name, path, modules):
            if (
                target in modules
                and target != name
                and target.rpartition(".")[0] == pkg
                and modules[target].name != "__init__.py"
            ):
                deps.add(target)
        graph[name] = deps
    circles = []
    state: dict[str, int] = {}

    def visit(n: str, stack: list[str]) -> None:
        state[n] = 1
        for d in sorted(graph.get(n, ())):
            if state.get(d) == 1:
                circles.append(" -> ".join([*stack[stack.index(d) :], d]))
            elif d not in state:
                visit(d, [*stack, d])
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n, [n])
    assert circles == []


def test_no_private_name_is_imported_from_another_module() -> None:
    modules = _modules()
    found = []
    for name, path in modules.items():
        for target, names in _imports(name, path, modules):
            if not target.startswith("airfs"):
                continue
            found += [f"{name}: {target}.{n}" for n in names if n.startswith("_")]
    assert found == []
