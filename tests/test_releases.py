"""Each component's releases as data with sources (src/imgbuild/blocks/*/releases.yaml, issue 30): the shipped files
load and say where each row was read, a bad file is refused naming the file and the key, and a new EFA installer
resolves from its row alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from imgbuild.blocks import _releases as releases
from imgbuild.blocks.aws_ofi_nccl import plugin_fact, plugin_file
from imgbuild.blocks.efa import EfaFile, efa_file, efa_release
from imgbuild.cli import app
from imgbuild.core.errors import ResolveError


def test_every_shipped_row_names_its_source_and_inferred_rows_say_why() -> None:
    files = [efa_file(), plugin_file(), releases.tag_file("nccl_tests"), releases.tag_file("gdrcopy")]
    for f in files:
        assert f.about and f.read_on == "2026-11-26", f.component
        for row in f.releases:
            assert row.source, (f.component, row.version)
            assert row.inferred == (row.why is not None), (f.component, row.version)
    # aws-ofi-nccl 1.22.0's notes were not read: its row says so, and the conservative NCCL is 1.21's
    plugin = releases.by_version(plugin_file().releases)["1.22.0"]
    assert plugin.inferred and "not readable" in (plugin.why or "")
    assert plugin_fact("1.22.0", "tested_nccl") == plugin_fact("1.21.1", "tested_nccl") == "2.31.2"


@pytest.mark.parametrize(
    ("version", "plugin", "libfabric"),
    [("1.51.0", "1.22.0", "2.7.0amzn2.0"), ("1.49.0", "1.20.0", "2.4.0amzn5.0"), ("1.48.0", "1.19.0", None)],
)
def test_efa_rows_read_from_the_changelog(version: str, plugin: str | None, libfabric: str | None) -> None:
    row = efa_release(version)
    assert row is not None and (row.aws_ofi_nccl, row.libfabric) == (plugin, libfabric)
    assert ("debian11" in row.os) == (version != "1.51.0")  # 1.51.0 drops Debian 11 (AWS EFA changelog)


def test_a_release_row_wins_over_its_series() -> None:
    assert plugin_fact("1.16.3", "tested_nccl") == "2.27.7"
    assert plugin_fact("1.16.2", "tested_nccl") == "2.27.5"  # the 1.16 series' row
    assert plugin_fact("1.16.3", "tested_libfabric") == "2.1.0amzn5.0"
    assert plugin_fact("1.17.3", "tested_nccl") == "2.28.7"  # its own row names only a libfabric
    assert plugin_fact("1.8.0", "tested_nccl") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("component: efa\nabout: x\nread_on: '2026-11'\nreleases:\n- {version: 1.0.0, os: [debian12]}\n",
         "releases.0.source: Field required"),
        ("component: efa\nabout: x\nread_on: '2026-11'\nreleases:\n- {version: 1.0.0, source: s, os: [debian12], "
         "inferred: true}\n", "releases.0: Value error, inferred: true needs `why`"),
        ("component: efa\nabout: x\nread_on: '2026-11'\nreleases:\n- {version: 1.0.0, source: s, os: [debian12], "
         "aws_ofi_nccl: 1.2}\n", "releases.0.aws_ofi_nccl: Input should be a valid string"),
        ("component: efa\nabout: x\nread_on: 'late 2026'\nreleases:\n- {version: 1.0.0, source: s, os: [debian12]}\n",
         "read_on: String should match pattern"),
        ("component: efa\nabout: x\nread_on: null\nreleases:\n- {version: 1.0.0, source: s}\n"
         "- {version: 1.0.0, source: t}\n", "version 1.0.0 is listed twice"),
        ("component: efa\nabout: x\nread_on: null\nreleases: [\n", "not valid YAML"),
    ],
)  # fmt: skip
def test_a_bad_release_file_names_the_file_and_the_key(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "efa.yaml"
    path.write_text(text)
    with pytest.raises(ResolveError) as info:
        releases.load(path, releases.ReleaseFile if "listed twice" in expected else EfaFile)
    assert str(path) in str(info.value) and expected in str(info.value), str(info.value)
    assert info.value.exit_code == 5


def test_a_child_of_h100_with_efa_1_51_resolves(recipe_dir: Path) -> None:
    """Issue 30's done-when: `efa: {version: 1.51.0}` in a child of h100 resolves (it was refused 'aws-ofi-nccl
    1.22.0 is not in the shipped table'), with the plugin EFA 1.51.0 bundles."""
    path = recipe_dir / "mine.yaml"
    path.write_text("extends: h100\ncomponents:\n  efa: {version: 1.51.0}\n")
    result = CliRunner().invoke(app, ["show", str(path), "--json"])
    assert result.exit_code == 0, result.output
    pins = json.loads(result.stdout)["components"]
    assert pins["efa"]["version"] == "1.51.0"
    assert pins["aws_ofi_nccl"]["version"] == "1.22.0"
    assert pins["aws_ofi_nccl"]["origin"] == "bundled with EFA installer 1.51.0"
    assert pins["aws_ofi_nccl"]["details"]["tested_nccl"] == "2.31.2"
