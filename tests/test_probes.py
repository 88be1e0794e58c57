"""Programs that run inside images have one home: files under imgbuild/probes, read by `probes.text`. The ones that
need only the standard library run here as the checks run them in a container (`python3 -c TEXT ARGS`, one JSON
line read back)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from imgbuild import probes

SRC = Path(probes.__file__).resolve().parent.parent.parent


def run(name: str, *args: str) -> object:
    ran = subprocess.run([sys.executable, "-c", probes.text(name), *args], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout.splitlines()[-1])


def test_app_dists_reads_installed_versions() -> None:
    import pydantic

    assert run("app_dists.py", json.dumps(["pydantic", "no-such-distribution-here"])) == {
        "pydantic": pydantic.VERSION,
        "no-such-distribution-here": None,
    }


def test_app_imports_imports_and_names_failures() -> None:
    got = run("app_imports.py", json.dumps(["packaging"]), json.dumps(["json", "no_such_module_here"]), "[]")
    assert isinstance(got, dict)
    assert got["modules"] == {"packaging": ["packaging"]}
    assert got["ok"] == ["packaging", "json"]
    assert got["errors"]["no_such_module_here"].startswith("ModuleNotFoundError")


def test_nccl_lib_without_nccl_finds_none(tmp_path: Path) -> None:
    assert run("nccl_lib.py", json.dumps([str(tmp_path / "*")])) == {"candidates": []}


@pytest.mark.parametrize("path", sorted((SRC / "imgbuild").rglob("*.py")), ids=lambda p: str(p.relative_to(SRC)))
def test_no_program_text_outside_probes(path: Path) -> None:
    """No module outside probes/ holds a multi-line Python program as a string (the form probes had before they were
    files): a string constant of several lines that parses as Python with an import statement."""
    if path.parent.name == "probes":
        return
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.count("\n") > 3:
            try:
                body = ast.parse(node.value).body
            except SyntaxError:
                continue
            assert not any(isinstance(s, ast.Import | ast.ImportFrom) for s in body), (
                f"{path}:{node.lineno}: a program in a string; make it a file under imgbuild/probes"
            )
