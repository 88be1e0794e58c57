"""The front door and the docs site: README.md is short and shows the main job first; `mkdocs build --strict`
passes offline (no web fonts, no fetches: proxies pointed at a closed port), and what the site generates from the
code is there: every command, every exit code, every recipe key, and the schema `imgbuild schema` prints."""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
import typer
from typer.testing import CliRunner

from imgbuild.cli import app
from imgbuild.core import errors
from imgbuild.recipe.schema import recipe_schema

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
# The quick start's commands: what sets up a fresh machine, runs the main job and the tests (scripts/*.sh).
QUICK_START = (
    "bash scripts/main.sh     # main job: Docker engine + base image + package, then build and verify the cpu image",
    "bash scripts/test.sh     # tests: same setup, ruff, mypy, the fast lane first, then Docker and network",
)


def mkdocs_build(config: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """`mkdocs build --strict` of `config` into `out`, this tree's imgbuild importable, any web fetch failing."""
    closed = "http://127.0.0.1:9"  # the discard port: nothing listens, so any fetch fails at once
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
        "HTTP_PROXY": closed,
        "HTTPS_PROXY": closed,
        "http_proxy": closed,
        "https_proxy": closed,
        "NO_PROXY": "",
        "no_proxy": "",
        "NO_MKDOCS_2_WARNING": "1",
    }
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "-d", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if "No module named mkdocs" in built.stderr:
        pytest.fail('mkdocs is not installed (pip install -e ".[dev]": mkdocs-material is in the dev extra)')
    return built


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    built = mkdocs_build(REPO / "mkdocs.yml", out)
    assert built.returncode == 0, built.stdout + built.stderr
    assert "WARNING" not in built.stderr, built.stderr
    return out


def page(site: Path, name: str) -> str:
    """A built page's text, tags dropped and entities decoded."""
    text = (site / name / "index.html").read_text()
    return html.unescape(re.sub(r"<[^>]+>", "", text))


def test_readme_is_a_front_door() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines (at most 200: the reference belongs in docs/)"
    first = "\n".join(lines[:60])
    for line in QUICK_START:
        assert line in first, f"the quick start's command is not in README.md's first 60 lines: {line}"
    assert re.search(r"^imgbuild build gaudi-1\.15\s+#", first, re.MULTILINE), "the main job is not in the first 60"
    assert "examples/pytorch-app" in README.read_text()


@pytest.mark.parametrize("name", ["README.md", "CONTRIBUTING.md", "CHANGELOG.md"])
def test_relative_links_reach_files(name: str) -> None:
    text = (REPO / name).read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)\s]*)?\)", text)
    local = [link for link in links if "://" not in link]
    missing = [link for link in local if not (REPO / link).exists()]
    assert not missing, f"{name} links to what is not in the repository: {missing}"


def test_every_command_is_in_the_site(site: Path) -> None:
    text = page(site, "commands")

    def walk(command: typer.core.TyperCommand, path: str) -> list[str]:
        found = [path]
        for name, sub in (getattr(command, "commands", None) or {}).items():
            if not sub.hidden:
                found += walk(sub, f"{path} {name}")
        return found

    names = walk(typer.main.get_command(app), "imgbuild")
    assert {"imgbuild build", "imgbuild schema", "imgbuild cluster job", "imgbuild sources fetch"} <= set(names)
    missing = [name for name in names if name not in text]
    assert not missing, f"commands missing from the site's commands page: {missing}"
    assert "--scan-gate" in text and "--cache-from" in text  # options too, not only the names


def _words(text: str) -> str:
    """Text as a built page shows it: Markdown's backticks gone, whitespace one space."""
    return " ".join(text.replace("`", "").split())


def _params(command: click.Command, path: str) -> list[tuple[str, click.Parameter]]:
    """Every parameter of `command` and of its visible subcommands, each with its command's path."""
    found = [(path, param) for param in command.params]
    for name, sub in (getattr(command, "commands", None) or {}).items():
        if not sub.hidden:
            found += _params(sub, f"{path} {name}")
    return found


def test_every_option_help_is_on_the_commands_page(site: Path) -> None:
    """Each option's and argument's help is written once, where typer declares it, and the site shows that text:
    compared with the click objects typer makes, not with text copied here."""
    text = _words(page(site, "commands"))
    params = [(path, p) for path, p in _params(typer.main.get_command(app), "imgbuild") if not getattr(p, "hidden", 0)]
    assert len({path for path, _ in params}) >= 15 and len(params) >= 80
    assert any(path.startswith("imgbuild cluster ") for path, _ in params)  # subcommands' options too
    no_help = [f"{path} {param.name}" for path, param in params if not getattr(param, "help", None)]
    assert not no_help, f"options and arguments without help: {no_help}"
    missing = [f"{path} {p.name}: {p.help!r}" for path, p in params if _words(getattr(p, "help", "")) not in text]
    assert not missing, f"help not on the site's commands page: {missing}"


def test_every_recipe_key_help_is_on_the_recipe_keys_page(site: Path) -> None:
    """Each key's description in the schema (its field's docstring) is the text of its row on the site."""
    text = _words(page(site, "recipe-keys"))
    schema = recipe_schema()
    described = [
        (f"{where}.{key}", prop["description"])
        for where, node in [("(top)", schema), *schema["$defs"].items()]
        for key, prop in node.get("properties", {}).items()
        if prop.get("description")
    ]
    assert len(described) >= 100
    missing = [key for key, description in described if _words(description) not in text]
    assert not missing, f"recipe keys whose help is not on the site's recipe-keys page: {missing}"


def test_every_exit_code_is_in_the_site(site: Path) -> None:
    text = page(site, "exit-codes")
    todo: list[type[errors.ImgbuildError]] = [errors.ImgbuildError]
    classes = []
    while todo:
        cls = todo.pop()
        classes.append(cls)
        todo += cls.__subclasses__()
    assert len({c.exit_code for c in classes}) >= 19
    for cls in classes:
        # a subclass defined elsewhere (publish.scan's ScanGateFailed, imported by an earlier test or not) exits with
        # its core class's code: the page names the core class, and every code has its row
        name = cls.__name__ if cls.__module__ == errors.__name__ else r"\w+"
        row = re.search(rf"^\s*{cls.exit_code}\s*\n\s*{name}\s*$", text, re.MULTILINE)
        assert row, f"exit code {cls.exit_code} ({cls.__name__}) is not a row of the site's exit-codes page"


def test_every_recipe_key_is_in_the_site(site: Path) -> None:
    text = page(site, "recipe-keys")
    schema = recipe_schema()
    keys = list(schema["properties"])
    components = schema["$defs"]["Components"]["properties"]
    keys += [f"components.{name}" for name in components]
    keys += [f"platform.{name}" for name in schema["$defs"]["Platform"]["properties"]]
    assert {"extends", "components.pytorch", "platform.arch", "app", "hold"} <= set(keys)
    missing = [key for key in keys if key not in text]
    assert not missing, f"recipe keys missing from the site: {missing}"


def test_the_site_serves_the_schema_imgbuild_prints(site: Path) -> None:
    printed = CliRunner().invoke(app, ["schema"])
    assert printed.exit_code == 0, printed.output
    assert json.loads((site / "recipe.schema.json").read_text()) == json.loads(printed.stdout)


def test_the_reference_left_the_readme_for_the_site(site: Path) -> None:
    """The sections the README held are pages of the site, each with its own content."""
    expected = {
        "targets": "One NCCL.",
        "recipes": "Architectures (platform.arch)",
        "locks": "Air-gapped sites",
        "building": "Which CLI.",
        "running": "imex channels",
        "verifying": "Ending a DDP program cleanly",
        "sagemaker": "sagemaker_submit_directory",
        "clusters": "imgbuild cluster report",
        "publishing": "Scan gate",
        "architecture": "import-linter",
        "contributing": "Mark a release, or a combination, known bad",
        "changelog": "Unreleased",
    }
    for name, words in expected.items():
        assert words in page(site, name), f"docs/{name}.md: {words!r} is not on the built page"


def test_no_page_loads_anything_from_the_web(site: Path) -> None:
    """The site reads offline and air-gapped: no web fonts, scripts or styles from elsewhere."""
    pages = list(site.rglob("*.html"))
    assert len(pages) >= 15
    for built in pages:
        remote = re.findall(r"<(?:link|script|img)\b[^>]*(?:href|src)=\"(?:https?:)?//[^\"]*\"", built.read_text())
        assert not remote, f"{built.relative_to(site)} loads {remote}"


def test_a_generated_part_that_does_not_exist_fails_the_build(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Commands\n\n<!-- generated: comands -->\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text(f"site_name: t\ndocs_dir: {docs}\nhooks:\n  - {REPO / 'docs' / 'hooks.py'}\n")
    built = mkdocs_build(config, tmp_path / "site")
    assert built.returncode != 0
    assert "index.md: no generated part named 'comands'" in built.stdout + built.stderr


def _drawing() -> dict[str, str]:
    """docs/architecture.md's drawing of the tree: each package's entry (`  name/` and its lines), by name."""
    text = (REPO / "docs" / "architecture.md").read_text()
    block = text.split("```\nsrc/imgbuild/", 1)[1].split("```", 1)[0]
    entries: dict[str, str] = {}
    name = None
    for line in block.splitlines()[1:]:
        m = re.match(r"  ([a-z_]+)/ ", line)
        if m:
            name = m.group(1)
            entries[name] = ""
        elif not line.startswith("  ") or not line.strip():
            name = None
        if name is not None:
            entries[name] += line + "\n"
    return entries


def test_the_architecture_drawing_names_every_package_and_module() -> None:
    """A newcomer finds each stage by its file name: every package of src/imgbuild has its entry in the drawing, and
    the entry names each of its modules and sub-packages (a block's own folder is drawn once, as blocks/<name>/;
    probes are programs, drawn by what they do)."""
    src = REPO / "src" / "imgbuild"
    drawn = _drawing()
    packages = sorted(p.name for p in src.iterdir() if (p / "__init__.py").exists())
    assert sorted(drawn) == packages
    missing = []
    for package in packages:
        if package == "probes":
            continue
        for path in sorted((src / package).iterdir()):
            if path.name.startswith("__") or path.suffix not in (".py", "") or path.name == "__pycache__":
                continue
            if path.is_dir() and not (path / "__init__.py").exists():
                continue  # a folder of data (cluster/templates)
            if package == "blocks" and path.is_dir():
                continue  # each block's folder: blocks/<name>/
            shown = path.name if path.suffix == ".py" else f"{path.name}/"
            if shown not in drawn[package]:
                missing.append(f"{package}/{shown}")
    assert missing == [], "docs/architecture.md's drawing does not name these"


def test_the_architecture_drawing_names_no_module_that_is_gone() -> None:
    src = REPO / "src" / "imgbuild"
    stale = [
        f"{package}/{name}"
        for package, entry in _drawing().items()
        for name in re.findall(r"\b([a-z_]+\.py)\b", entry)
        if not any((src / package).rglob(name))
    ]
    assert stale == []
