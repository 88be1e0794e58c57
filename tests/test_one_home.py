"""One home per component (issue 43): a component's block, template, release rows (with where each was read), rules
against other components and the reader of its publisher's artifacts live in blocks/<name>/; the core and the
pipeline know a short, listed set of component names; the core's tables (platforms, distro) hold no per-component
one."""

from __future__ import annotations

import ast
import re
import typing
from pathlib import Path

import pytest

from conftest import REPO
from imgbuild.blocks import REGISTRY, Released, _releases
from imgbuild.core import distro, instances, platforms, versions
from imgbuild.recipe import Platform

SRC = REPO / "src" / "imgbuild"
NAMES = {b.name for b in REGISTRY}

# The component names each module of the core and the pipeline may use (as a string, an attribute or an import of the
# block), and why; every other module outside blocks/<name>/ names none. The registry (blocks/registry.py) imports
# every block and names none otherwise.
ALLOWED: dict[str, set[str]] = {
    "blocks/__init__.py": set(),
    "blocks/_block.py": set(),
    "blocks/_releases.py": set(),
    "blocks/knownbad.py": set(),
    "blocks/_core.py": {"cuda", "python"},  # the target's CUDA_HOME and -gencode, the interpreter pip installs under
    "pin/resolver.py": {"pytorch"},  # the package index's reader of a torch wheel's pins (resolve(lookup_torch=))
    "pin/lock.py": {"pytorch", "python"},  # a lock's own record of that wheel; python: ctx.python
    "pin/locking.py": {"python"},
    "pin/wheels.py": {"python"},
    "pin/artifacts.py": set(),
    "pin/checksums.py": set(),
    "pin/record.py": set(),
    "pin/outdated.py": set(),
    "image/render.py": {"python"},  # content.python: the requirement sets the lock records
    "image/dockerfile.py": {"python"},  # the uv install steps: the python block's uv
    "core/platforms.py": set(),
    "core/distro.py": set(),
    "core/versions.py": set(),
}


def named(path: Path) -> set[str]:
    """The component names a module uses: string constants, attributes and imports of imgbuild.blocks.<name>."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in NAMES:
            found.add(node.value)
        elif isinstance(node, ast.Attribute) and node.attr in NAMES:
            found.add(node.attr)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("imgbuild.blocks."):
            part = node.module.split(".")[2]
            found |= {part} & NAMES
        elif isinstance(node, ast.ImportFrom) and node.module == "imgbuild.blocks" and path != REGISTRY_MODULE:
            found |= {a.name for a in node.names} & NAMES
    return found


REGISTRY_MODULE = SRC / "blocks" / "registry.py"  # imports every block (the REGISTRY's list), names none otherwise


@pytest.mark.parametrize("module", sorted(ALLOWED))
def test_the_core_names_only_the_components_it_is_listed_for(module: str) -> None:
    assert named(SRC / module) <= ALLOWED[module], f"{module} names {sorted(named(SRC / module) - ALLOWED[module])}"


def test_a_release_file_is_read_only_in_its_components_folder() -> None:
    """`component_file("x", ...)` (the generic reader) appears in blocks/x/ alone: others ask the block."""
    for path in SRC.rglob("*.py"):
        for name in re.findall(r'component_file\("(\w+)"', path.read_text()):
            assert path.parent == SRC / "blocks" / name, f"{path.relative_to(SRC)} reads {name}'s release file"


@pytest.mark.parametrize("block", [b for b in REGISTRY if isinstance(b, Released)], ids=lambda b: b.name)
def test_every_release_file_says_where_each_fact_was_read(block) -> None:
    """Each row names its source; an inferred row says why (the model refuses one that does not, so a file that
    loads proves it); the file is blocks/<name>/releases.yaml, for that component."""
    listed = block.release_file()
    assert (SRC / "blocks" / block.name / "releases.yaml").is_file() and listed.component == block.name
    assert listed.about and listed.releases
    for row in listed.releases:
        assert row.source.strip(), row.version
        assert (row.why is not None) == row.inferred, row.version
        for url, checksum in row.downloads.items():
            assert checksum.sha256 is not None or checksum.origin.startswith(_releases.UNESTABLISHED), url
    for combo in listed.known_bad:
        assert combo.source and combo.links and block.name in {k.split(".")[0] for k in combo.when}


def test_the_instance_table_says_where_each_family_was_read() -> None:
    for name, row in instances.table().families.items():
        assert row.source.strip() and (row.why is not None) == row.inferred, name
        assert row.accelerator != "nvidia" or row.gpu_arch, name
    assert set(instances.mnnvl_families()) == {"p6e-gb200", "p6e-gb300"}


def test_the_core_tables_hold_no_component_table_and_checksums_yaml_is_gone() -> None:
    """What was spec/compat.py (now core/platforms.py, core/distro.py, core/versions.py) holds none of the
    per-component tables it once did."""
    gone = {"TORCH", "TORCH_AARCH64", "GAUDI", "NCCL_NET_PLUGIN_API", "PLUGIN_OLDEST_NCCL", "ARCH", "CUDA_DRIVER"}
    gone |= {"EFA_KEY_FINGERPRINT", "EFA_CONTAINER_FLAGS", "EFA_NGC_DETECTION", "MNNVL_FAMILIES", "MNNVL_ENV"}
    for module in (platforms, distro, versions):
        assert not gone & set(vars(module)), (module.__name__, sorted(gone & set(vars(module))))
    assert set(distro.TABLES) == {"DISTRO"}  # what each distribution release ships: per OS, not per component
    assert not (SRC / "pin" / "checksums.yaml").exists()


def test_the_recipe_schema_knows_the_architectures_cuda_lists() -> None:
    from imgbuild.blocks.cuda import arches

    (literal,) = [a for a in typing.get_args(Platform.model_fields["gpu_arch"].annotation) if a is not type(None)]
    assert set(typing.get_args(literal)) == set(arches())
