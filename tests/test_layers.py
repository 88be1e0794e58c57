"""The package tree is the pipeline: imports run one way (the layer contract in pyproject.toml, checked by
import-linter's own command, type-only imports included) and no module imports itself through others (no import
circle; imports under `if TYPE_CHECKING:` are left out of that one: they never run). Every package's `__init__` is a
face (its docstring, imports and `__all__`), and a module over 600 lines says in its docstring why it is one job."""

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


SRC = REPO / "src" / "imgbuild"
LONG = 600


def _face_breaks(path: Path) -> list[str]:
    """What in `path` is more than a face: anything but a docstring, imports, `__all__` (and the root's
    `__version__`)."""
    allowed = {"__all__", "__version__"}
    out = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            continue
        if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) and t.id in allowed for t in node.targets):
            continue
        out.append(f"{type(node).__name__} at line {node.lineno}")
    return out


def test_every_package_init_is_a_face() -> None:
    broken = {str(p.relative_to(SRC)): found for p in sorted(SRC.rglob("__init__.py")) if (found := _face_breaks(p))}
    assert broken == {}, "an __init__.py holds more than imports and __all__: move it to a module named for its job"


def test_a_face_is_found_out(tmp_path: Path) -> None:
    face = tmp_path / "__init__.py"
    face.write_text('"""A face."""\n\nfrom a import b\n\n__all__ = ["b"]\n')
    assert _face_breaks(face) == []
    face.write_text('"""Not one."""\n\nfrom a import b\n\n\ndef c() -> None:\n    b()\n')
    assert _face_breaks(face) == ["FunctionDef at line 6"]


def test_a_long_module_says_why_it_is_one_job() -> None:
    long = {
        str(p.relative_to(SRC)): n
        for p in sorted(SRC.rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > LONG
        and "one job" not in (ast.get_docstring(ast.parse(p.read_text())) or "").lower()
    }
    assert long == {}, f"modules over {LONG} lines whose docstring does not say why they are one job"
