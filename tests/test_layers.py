"""The package tree is the pipeline: imports run one way (the layer contract in pyproject.toml, checked by
import-linter's own command) and no module imports itself through others (no import circle). Imports under
`if TYPE_CHECKING:` are left out: they are for the type checker, never run."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parent.parent


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The import circles of `graph`: its strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in sorted(graph.find_modules_directly_imported_by(module)):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def package_reads(root: Path, package: str) -> list[tuple[str, str]]:
    """(importer, package) for each `from PACKAGE import name` in the modules under `root`, at any depth (inside
    functions too), leaving out `if TYPE_CHECKING:` blocks. Such a line reads PACKAGE's `__init__` namespace, so it
    depends on that `__init__` and on all it imports; grimp records only the submodule when `name` is one."""

    def walk(node: ast.AST, module: str, pkg: str, found: list[tuple[str, str]]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for other in child.orelse:
                    walk(other, module, pkg, found)
                continue
            if isinstance(child, ast.ImportFrom) and child.module is not None:
                if child.level:
                    base = pkg.rsplit(".", child.level - 1)[0] if child.level > 1 else pkg
                    target = f"{base}.{child.module}" if child.module else base
                else:
                    target = child.module
                if target.split(".")[0] == package and target != module:
                    found.append((module, target))
            walk(child, module, pkg, found)

    found: list[tuple[str, str]] = []
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        is_init = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if is_init else parts)
        pkg = module if is_init else module.rpartition(".")[0]
        walk(ast.parse(path.read_text(), str(path)), module, pkg, found)
    return found


def import_graph() -> grimp.ImportGraph:
    """The package's imports as grimp reads them (function-level imports counted, TYPE_CHECKING ones left out),
    plus each `from PACKAGE import name` as an import of PACKAGE itself."""
    graph = grimp.build_graph("imgbuild", exclude_type_checking_imports=True)
    for importer, imported in package_reads(REPO / "src", "imgbuild"):
        if imported in graph.modules:
            graph.add_import(importer=importer, imported=imported)
    return graph


def test_no_module_imports_itself_through_others() -> None:
    """No circle in the whole package, imports inside functions counted: blocks.efa, libfabric and openmpi once
    read `from imgbuild.blocks import gaudi`, which runs imgbuild.blocks' `__init__`, which imports them."""
    assert circles(import_graph()) == []


def test_a_package_read_is_an_import_of_the_package(tmp_path: Path) -> None:
    """`from pkg import sub` inside a function of a module that pkg's `__init__` imports is found as a circle;
    the same line under `if TYPE_CHECKING:` is not counted."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from pkg import a, b\n")
    (pkg / "a.py").write_text("def f():\n    from pkg import b\n    return b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n")
    reads = package_reads(tmp_path, "pkg")
    assert sorted(reads) == [("pkg.a", "pkg")]
    graph = grimp.ImportGraph()
    for module in ("pkg", "pkg.a", "pkg.b"):
        graph.add_module(module)
    graph.add_import(importer="pkg", imported="pkg.a")
    graph.add_import(importer="pkg", imported="pkg.b")
    for importer, imported in reads:
        graph.add_import(importer=importer, imported=imported)
    assert circles(graph) == [["pkg", "pkg.a"]]


def test_circles_are_found() -> None:
    """The search finds a circle where there is one (a graph made here, not the package's)."""
    graph = grimp.ImportGraph()
    for module in ("a", "a.x", "a.y", "a.z"):
        graph.add_module(module)
    graph.add_import(importer="a.x", imported="a.y")
    graph.add_import(importer="a.y", imported="a.x")
    graph.add_import(importer="a.z", imported="a.x")
    assert circles(graph) == [["a.x", "a.y"]]


def test_the_floors_import_only_downward() -> None:
    """import-linter's `lint-imports` with the project's contract (pyproject.toml [tool.importlinter])."""
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    ran = subprocess.run([exe, "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "1 kept, 0 broken" in ran.stdout
