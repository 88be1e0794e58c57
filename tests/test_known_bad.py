"""Known-bad releases and combinations (issue 43): a component's release file marks a release, or a combination with
other components, bad with the upstream pages that say so; `imgbuild lock` refuses it (or warns where upstream calls
it a risk) naming the recipe's key, the links and the nearest good release; a `hold:` keeps a refused one only where
its reason cites a link. Each kind through the CLI users run (`python -m imgbuild lock`), each fact from the shipped
release files (blocks/*/releases.yaml)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SHIPPED
from imgbuild import recipe
from imgbuild.blocks import BY_NAME, KnownBad, Released, known_bad
from imgbuild.blocks.aws_ofi_nccl import plugin_file
from imgbuild.core.errors import ResolveError
from imgbuild.pin.lock import resolved_for

# the rows as shipped: the tests read the links from them, never type them again
HANG = plugin_file().releases
(BROADCAST_HANG,) = [r.bad for r in HANG if r.version == "1.18.0" and r.bad is not None]
(RISK,) = [r.bad for r in HANG if r.version == "1.19" and r.bad is not None]


def lock(recipe: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`imgbuild lock RECIPE --offline` as users run it, with no Docker engine to ask (base digests unrecorded)."""
    env = {**os.environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    return subprocess.run(
        [sys.executable, "-m", "imgbuild", "lock", str(recipe), "--offline", *args],
        capture_output=True, text=True, timeout=300, env=env, cwd=recipe.parent,
    )  # fmt: skip


def one_line(text: str) -> str:
    return " ".join(text.split())


def test_a_known_bad_release_is_refused_naming_the_key_the_links_and_the_good_release(recipe_dir: Path) -> None:
    """EFA installer 1.47.0 bundles aws-ofi-nccl 1.18.0, which hangs on large broadcasts: refused (exit 5, the
    resolver's), nothing written."""
    path = recipe_dir / "old.yaml"
    path.write_text("extends: a100\ncomponents:\n  efa: {version: 1.47.0}\n")
    done = lock(path)
    assert done.returncode == ResolveError.exit_code, done.stderr
    err = one_line(done.stderr)
    assert (
        "old.yaml: components.aws_ofi_nccl.version: aws_ofi_nccl 1.18.0 (bundled with EFA installer 1.47.0) is known "
        "bad: it hangs indefinitely on large inter-node NCCL broadcasts" in err
    ), err
    assert all(link in err for link in BROADCAST_HANG.links) and BROADCAST_HANG.good == "1.20.0"
    assert "the nearest good release: 1.20.0 [blocks/aws_ofi_nccl/releases.yaml]" in err
    assert "hint: use 1.20.0, or keep it with hold.aws_ofi_nccl: a reason that cites one of those links" in err
    assert not (recipe_dir / "old.lock.json").exists()


def test_a_hold_keeps_a_known_bad_release_only_where_it_cites_the_link(recipe_dir: Path) -> None:
    path = recipe_dir / "held.yaml"
    base = "extends: a100\ncomponents:\n  efa: {version: 1.47.0}\nhold:\n"
    path.write_text(base + "  aws_ofi_nccl: our jobs never broadcast\n")
    assert lock(path).returncode == ResolveError.exit_code  # a reason that does not say it knows: still refused
    link = BROADCAST_HANG.links[-1]
    path.write_text(base + f"  aws_ofi_nccl: our jobs never broadcast large tensors ({link})\n")
    done = lock(path)
    assert done.returncode == 0, done.stderr
    err = one_line(done.stderr)
    assert "warning: aws_ofi_nccl 1.18.0 (bundled with EFA installer 1.47.0) is known bad" in err
    assert "(kept: hold.aws_ofi_nccl cites it)" in err
    assert (recipe_dir / "held.lock.json").is_file()


def test_a_known_risk_is_a_warning_and_the_lock_is_written(recipe_dir: Path) -> None:
    """EFA installer 1.48.0 bundles aws-ofi-nccl 1.19.0: upstream names 1.20.0 as the fix and says nothing of 1.19.x."""
    path = recipe_dir / "risk.yaml"
    path.write_text("extends: a100\ncomponents:\n  efa: {version: 1.48.0}\n")
    done = lock(path)
    assert done.returncode == 0, done.stderr
    err = one_line(done.stderr)
    assert "warning: aws_ofi_nccl 1.19.0 (bundled with EFA installer 1.48.0) is a known risk:" in err
    assert all(link in err for link in RISK.links) and "the nearest good release: 1.20.0" in err
    assert (recipe_dir / "risk.lock.json").is_file()


def test_a_known_bad_combination_is_refused_before_the_rules_that_follow_it(recipe_dir: Path) -> None:
    """CUDA 13 with sm_70 (V100): blocks/cuda/releases.yaml's combination, refused as soon as the cuda pin is made
    (before PyTorch's rules complain about the wheel's CUDA)."""
    path = recipe_dir / "volta.yaml"
    path.write_text("extends: v100\ncuda: {version: 13.0.1}\n")
    done = lock(path)
    assert done.returncode == ResolveError.exit_code, done.stderr
    err = one_line(done.stderr)
    assert "volta.yaml: cuda.version: cuda 13.0.1 with cuda.gpu_arch sm_70 is known bad: CUDA 13 builds" in err
    assert "https://docs.nvidia.com/cuda/cuda-features-archive/index.html" in err
    assert "[blocks/cuda/releases.yaml]" in err and "torch" not in err


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"level": "maybe"}, "bad.level"),
        ({"links": []}, "bad.links"),
        ({"links": ["aws/aws-ofi-nccl#1055"]}, "bad.links.0"),
    ],
)
def test_a_bad_mark_without_its_level_or_a_link_is_the_files_error(tmp_path: Path, row: dict, message: str) -> None:
    from imgbuild.blocks import _releases

    good = {"level": "refuse", "why": "it hangs", "links": ["https://github.com/o/r/issues/1"]}
    data = {"component": "x", "about": "x", "read_on": None,
            "releases": [{"version": "1.0", "source": "x", "bad": {**good, **row}}]}  # fmt: skip
    path = tmp_path / "releases.yaml"
    import yaml

    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ResolveError, match=rf"{path}: releases\.0\.{message}"):
        _releases.load(path, _releases.ReleaseFile)


def test_a_combination_names_components_and_specifiers() -> None:
    from pydantic import ValidationError

    from imgbuild.blocks._releases import Combination

    ok = {"level": "warn", "why": "x", "links": ["https://a.example/b"], "source": "x"}
    assert Combination(**ok, when={"cuda": ">=13", "cuda.gpu_arch": "sm_70"})
    for when, problem in (({"cuda": "13"}, "expected a version specifier"), ({"cuda": "=>13"}, "not a PEP 440"),
                          ({"CUDA": ">=13"}, "expected a component's name")):  # fmt: skip
        with pytest.raises(ValidationError, match=problem):
            Combination(**ok, when=when)


def test_every_shipped_recipe_is_free_of_what_is_known_bad() -> None:
    """The shipped recipes refuse nothing and warn of nothing known bad (they resolve: test_recipes); and every bad
    mark and combination the shipped files hold names a file the registry knows."""
    files = [b for b in BY_NAME.values() if isinstance(b, Released)]
    assert {"aws_ofi_nccl", "cuda", "efa"} <= {b.name for b in files}
    marked = [r.bad for b in files for r in b.release_file().releases if r.bad] + [
        c for b in files for c in b.release_file().known_bad
    ]
    assert len(marked) >= 3 and all(m.links for m in marked)
    assert isinstance(known_bad({}), list) and not known_bad({})
    for name in SHIPPED:  # their locks' pins: nothing a release file marks, as a risk or as bad
        pins = resolved_for(recipe.load(name)).pins
        found: list[KnownBad] = known_bad(pins)
        assert found == [], (name, [f.message() for f in found])
