"""The building blocks: every source mode the schema accepts renders (golden files) or is declared as brought by
something else; a mode that should render and renders nothing is an error, never an empty layer."""

from __future__ import annotations

import re
import shutil
import typing
from pathlib import Path

import pytest
from packaging.version import Version

from conftest import REPO, SHIPPED
from imgbuild import recipe
from imgbuild.blocks import BY_NAME, REGISTRY, builder_order, resolve_order, runtime_order
from imgbuild.core.errors import RenderError
from imgbuild.image import dockerfile, identity, render
from imgbuild.pin.lock import resolved_for
from imgbuild.pin.resolver import resolve

GOLDEN = REPO / "tests" / "golden"
TEST_RECIPES = REPO / "tests" / "recipes"
EXTRA = sorted(p.stem for p in TEST_RECIPES.glob("*.yaml"))


def _resolved(name: str):
    if name in SHIPPED:
        return resolved_for(recipe.load(name))
    return resolve(recipe.load(TEST_RECIPES / f"{name}.yaml"), lookup_torch=None)


def _accepted_sources(block) -> set[str]:
    """The `source` values the block's options accept (its Literal), or its pins' one source."""
    field = block.options.model_fields.get("source")
    if field is None:
        return set(block.modes)
    return set(typing.get_args(field.annotation))


@pytest.mark.parametrize("name", EXTRA)
def test_golden_dockerfile_of_test_recipes(name: str, update_golden: bool) -> None:
    text = render.plan(_resolved(name)).dockerfile
    golden = GOLDEN / f"{name}.Dockerfile"
    if update_golden:
        golden.write_text(text)
    assert golden.exists(), f"no golden file: run pytest --update-golden and review {golden}"
    assert text == golden.read_text(), f"{name}: rendered Dockerfile differs from {golden} (--update-golden)"


def test_every_block_declares_every_mode_its_schema_accepts() -> None:
    for block in REGISTRY:
        assert _accepted_sources(block) <= set(block.modes), block.name


def test_every_fragment_mode_is_covered_by_a_golden_file() -> None:
    covered: set[tuple[str, str]] = set()
    for name in [*SHIPPED, *EXTRA]:
        for comp, pin in _resolved(name).pins.items():
            covered.add((comp, pin.source))
    missing = [
        f"{b.name}: {mode}"
        for b in REGISTRY
        for mode, how in b.modes.items()
        if how == "fragment" and (b.name, mode) not in covered
    ]
    assert not missing, f"source modes with no golden file: {missing}"


def test_mpi4py_pip_installs_that_version_against_the_images_mpicc() -> None:
    text = render.plan(_resolved("modes")).dockerfile
    assert (
        ' && CFLAGS="-O2 -g0" MPICC=/opt/openmpi/bin/mpicc /opt/venv/bin/pip install --no-index --find-links '
        "/root/.cache/pip/imgbuild-wheelhouse --no-binary=mpi4py --no-build-isolation mpi4py==4.0.3\n" in text
    )
    builder, runtime = text.split("# ---- runtime")
    assert builder.index("./configure --prefix=/opt/openmpi") < builder.index("mpi4py==4.0.3")
    assert "COPY --from=builder /opt/openmpi /opt/openmpi" in runtime


def _wheel_cache(name: str) -> str:
    """The id of the cache mount over pip's wheels/ folder in the recipe's mpi4py build."""
    text = render.plan(_resolved(name)).dockerfile
    step = text[text.index("RUN ", text.index("# mpi4py ")) :].split("\n\n")[0]
    assert dockerfile.PIP_CACHE_MOUNT in step and dockerfile.CA_MOUNT in step
    found = re.findall(r"--mount=type=cache,id=(\S+),target=/root/\.cache/pip/wheels,sharing=locked", step)
    assert len(found) == 1, step
    return found[0]


def test_mpi4py_never_reuses_a_wheel_built_for_another_mpi(recipe_dir: Path) -> None:
    """pip caches the wheel it builds from mpi4py's sdist by the sdist alone: the wheel cache is a mount of its own
    per MPI (builder base, Open MPI pin, mpicc), so another MPI never finds a wheel built for this one, while recipes
    with the same MPI share it."""
    ids = {name: _wheel_cache(name) for name in ("modes", "mpi4py-pip", "a100", "h100", "v100")}
    assert ids["modes"].startswith("imgbuild-pip-wheels-mpi4py-openmpi-source-4.1.6-")
    assert ids["mpi4py-pip"].startswith("imgbuild-pip-wheels-mpi4py-openmpi-distro-4.1.4-")
    assert ids["a100"].startswith("imgbuild-pip-wheels-mpi4py-openmpi-efa-1.51.0-")
    assert len({ids["modes"], ids["mpi4py-pip"], ids["a100"], ids["h100"]}) == 4, ids
    # The same MPI on the same builder base: one wheel cache.
    same = recipe_dir / "same.yaml"
    same.write_text("extends: cpu\nenv: {OTHER: '1'}\ncomponents: {mpi4py: {source: pip, version: 4.0.2}}\n")
    text = render.plan(resolve(recipe.load(same), lookup_torch=None)).dockerfile
    assert f"id={ids['mpi4py-pip']}," in text
    # Another Open MPI release built from source: another cache.
    other = recipe_dir / "other.yaml"
    other.write_text(
        "extends: cpu\ncomponents:\n  openmpi: {source: source, version: 4.1.7}\n"
        "  mpi4py: {source: pip, version: 4.0.3}\n"
    )
    text = render.plan(resolve(recipe.load(other), lookup_torch=None)).dockerfile
    assert "imgbuild-pip-wheels-mpi4py-openmpi-source-4.1.7-" in text and f"id={ids['modes']}," not in text


def test_a_fragment_mode_that_renders_nothing_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    resolved = _resolved("cpu")
    empty = tmp_path / "components"
    shutil.copytree(render.TEMPLATE_DIR, empty)
    (empty / "nccl" / "nccl.j2").write_text("{% macro builder(pin, ctx, r, pins) %}{% endmacro %}\n")
    import jinja2

    render.environment.cache_clear()
    monkeypatch.setattr(render, "TEMPLATE_DIR", empty)
    try:
        with pytest.raises(RenderError, match=r"components.nccl: source 'wheel' renders nothing"):
            render.plan(resolved)
    finally:
        monkeypatch.undo()
        render.environment.cache_clear()
    assert isinstance(render.environment().loader, jinja2.ChoiceLoader)


def test_a_source_the_block_does_not_declare_is_an_error() -> None:
    resolved = _resolved("cpu")
    pins = dict(resolved.pins)
    pins["nccl"] = pins["nccl"].model_copy(update={"source": "conda"})
    with pytest.raises(RenderError, match=r"components.nccl: source 'conda' is not one the block renders"):
        render.plan(resolved.model_copy(update={"pins": pins}))


def test_orders_follow_the_registry_and_dependencies() -> None:
    rt = runtime_order()
    assert rt == tuple(b.name for b in REGISTRY)
    b = builder_order()
    assert b.index("python") < b.index("nccl") < b.index("pytorch")
    assert b.index("efa") < b.index("aws_ofi_nccl") and b.index("openmpi") < b.index("mpi4py")
    r = resolve_order()
    for block in REGISTRY:
        for dep in block.after:
            assert r.index(dep) < r.index(block.name), (block.name, dep)
    assert set(BY_NAME) == set(rt)


def test_each_block_has_its_template_next_to_its_module() -> None:
    for block in REGISTRY:
        if any(how == "fragment" for how in block.modes.values()):
            assert (Path(render.TEMPLATE_DIR) / block.name / f"{block.name}.j2").is_file(), block.name


# ---- blocks that own everything about themselves: offers, post-install lines, shared build steps -------------------


def _dockerfile(resolved) -> str:
    """The Dockerfile alone (render.plan renders the context files too)."""
    ctx, contribs = render.contributions(resolved)
    return render._dockerfile(
        resolved,
        ctx,
        contribs,
        render._labels(resolved, identity.lock_digest(resolved), None, identity.image_digests(resolved)),
        render.environment(),
    )


def _configure_line(text: str, marker: str) -> str:
    """The ./configure command of the builder step that downloads `marker`, its continuation lines joined."""
    step = next(s for s in text.split("\n\n") if marker in s and "./configure" in s)
    start = step.index("./configure")
    command = step[start:].split("\n && ")[0].removesuffix(" \\")
    return " ".join(part.strip() for part in command.split("\\\n"))


def test_hwloc_is_offered_to_the_builds_that_use_it(recipe_dir: Path) -> None:
    """hwloc's own contribution: its packages in both stages, --with-hwloc (no directory: it is in the compiler's
    default paths) in Open MPI's and the plugin's configure when they build from source (neither names hwloc)."""
    (recipe_dir / "ompi.yaml").write_text(
        "extends: a100\ncomponents:\n  openmpi: {source: source, version: 4.1.6}\n  mpi4py: null\n"
    )
    resolved = resolve(recipe.load(recipe_dir / "ompi.yaml"), lookup_torch=None)
    text = _dockerfile(resolved)
    builder, runtime = text.split("# ---- runtime")
    assert "      libhwloc-dev \\\n" in builder and "      libhwloc15 \\\n" in runtime
    assert _configure_line(text, "openmpi-4.1.6") == (
        "./configure --prefix=/opt/openmpi --disable-static --with-ofi=/opt/amazon/efa --with-hwloc "
        "--with-cuda=/usr/local/cuda"
    )
    assert _configure_line(_dockerfile(_resolved("ofi-release")), "aws-ofi-nccl").endswith(
        "--enable-platform-aws --with-hwloc"
    )
    ctx, _ = render.contributions(resolved)
    assert ctx.configure_args("openmpi") == ["--with-ofi=/opt/amazon/efa", "--with-hwloc"]
    assert ctx.configure_args("nccl") == []


def test_without_hwloc_nothing_asks_for_it(recipe_dir: Path) -> None:
    (recipe_dir / "bare.yaml").write_text(
        "extends: a100\ncomponents:\n  efa: {version: 1.43.2}\n  aws_ofi_nccl: {source: release, version: 1.16.3}\n"
        "  hwloc: null\n"
    )
    text = _dockerfile(resolve(recipe.load(recipe_dir / "bare.yaml"), lookup_torch=None))
    assert "hwloc" not in text
    assert "--with-hwloc" not in _dockerfile(_resolved("modes"))  # Open MPI from source, no hwloc block
    assert _configure_line(_dockerfile(_resolved("modes")), "openmpi-4.1.6") == (
        "./configure --prefix=/opt/openmpi --disable-static --with-ofi"  # Debian's libfabric, in /usr
    )


# ---- configure lines: what compiling them catches and a golden file does not ---------------------------------------
# aws-ofi-nccl 1.16.3 and 1.21.1 compiled with these lines (issue 28): a `--with-X=/usr` makes configure add
# `-isystem /usr/include` and g++ fails in <cstdlib>; a release built without --with-gdrcopy has HAVE_GDRCOPY 0.

# `--with-X=/usr`, however the directory is written (/usr/, //usr, /usr/.), up to the end of the argument.
SYSTEM_WITH = re.compile(r"--with-[\w-]+=/+usr(?:/+\.?)*(?=[\s\\'\";]|$)", re.M)


def _rendered(name: str) -> list[tuple[str, str]]:
    """The Dockerfile of recipe `name` for each architecture it is built for: (arch, text)."""
    resolved = _resolved(name)
    return [(arch, render.plan(resolved, arch=arch).dockerfile) for arch in resolved.recipe.platform.arch]


def _configure_lines(text: str) -> list[str]:
    """Every ./configure command of a Dockerfile, its continuation lines joined."""
    lines = []
    for step in text.split("\n\n"):
        for start in [m.start() for m in re.finditer(r"\./configure ", step)]:
            command = step[start:].split("\n && ")[0].removesuffix(" \\")
            lines.append(" ".join(part.strip() for part in command.split("\\\n")))
    return lines


def test_system_with_pattern_catches_every_spelling_of_usr() -> None:
    for bad in ["--with-hwloc=/usr", "--with-cuda=/usr/", "--with-ofi=//usr", "--with-mpi=/usr/. \\", "--with-x=/usr;"]:
        assert SYSTEM_WITH.search(bad), bad
    for fine in ["--with-hwloc", "--with-mpi=/usr/lib/x86_64-linux-gnu/openmpi", "--with-cuda=/usr/local/cuda"]:
        assert not SYSTEM_WITH.search(fine), fine


@pytest.mark.parametrize("name", [*SHIPPED, *EXTRA])
def test_no_rendered_dockerfile_passes_usr_to_a_configure(name: str) -> None:
    """Every shipped and test recipe, every architecture: no `--with-X=/usr` anywhere in the Dockerfile, and every
    configure line's `--with-X=DIR` names a directory outside the compiler's default paths."""
    for arch, text in _rendered(name):
        assert SYSTEM_WITH.findall(text) == [], f"{name} ({arch})"
        for line in _configure_lines(text):
            dirs = re.findall(r"--with-[\w-]+=(\S+)", line)
            assert all(d.rstrip("/") not in ("/usr", "") for d in dirs), f"{name} ({arch}): {line}"


@pytest.mark.parametrize("name", [*SHIPPED, *EXTRA])
def test_the_plugin_is_built_against_gdrcopy_exactly_when_the_image_has_it(name: str) -> None:
    """A plugin built from its release gets --with-gdrcopy=<GDRCopy's prefix> exactly when the image has GDRCopy and
    the release's configure takes the option (1.18 on); GDRCopy is built before it, so gdrapi.h is there."""
    resolved = _resolved(name)
    plugin = resolved.pins.get("aws_ofi_nccl")
    text = render.plan(resolved).dockerfile
    lines = [line for line in _configure_lines(text) if "--enable-platform-aws" in line]
    if plugin is None or plugin.source != "release":
        assert lines == [] and "--with-gdrcopy" not in text
        return
    assert len(lines) == 1, lines
    gdrcopy = resolved.pins.get("gdrcopy")
    wanted = gdrcopy is not None and Version(plugin.version) >= Version("1.18")
    flags = [arg for arg in lines[0].split() if arg.startswith("--with-gdrcopy")]
    assert flags == ([f"--with-gdrcopy={gdrcopy.details.prefix}"] if wanted else []), name
    if wanted:
        assert text.index("# GDRCopy ") < text.index("# aws-ofi-nccl ")


def test_the_121_release_is_configured_against_the_images_gdrcopy(recipe_dir: Path) -> None:
    """The golden recipe's line, and the same recipe without GDRCopy (no flag: the plugin warns it wants it) and with
    GDRCopy in /usr (the bare flag: configure finds gdrapi.h in the default paths)."""
    line = _configure_line(_dockerfile(_resolved("ofi-release-gdrcopy")), "aws-ofi-nccl")
    assert line == (
        "./configure --prefix=/opt/aws-ofi-nccl --with-libfabric=/opt/amazon/efa --with-cuda=/usr/local/cuda "
        "--with-mpi=/opt/amazon/openmpi --with-gdrcopy=/opt/gdrcopy --enable-platform-aws --with-hwloc"
    )
    base = "extends: h200\ncomponents:\n  efa: {version: 1.50.0}\n  aws_ofi_nccl: {source: release, version: 1.21.1}\n"
    (recipe_dir / "none.yaml").write_text(base + "  gdrcopy: null\n")
    resolved = resolve(recipe.load(recipe_dir / "none.yaml"), lookup_torch=None)
    assert any("GDRCopy >= 2.5" in w for w in resolved.warnings)
    assert "gdrcopy" not in _configure_line(_dockerfile(resolved), "aws-ofi-nccl")
    (recipe_dir / "usr.yaml").write_text(base + "  gdrcopy: {version: 2.5.1, prefix: /usr/}\n")
    line = _configure_line(_dockerfile(resolve(recipe.load(recipe_dir / "usr.yaml"), lookup_torch=None)), "aws-ofi")
    assert " --with-gdrcopy " in f"{line} "


def test_a_recipe_prefix_of_usr_gives_the_bare_option(recipe_dir: Path) -> None:
    """A directory the recipe names that is the system's (/usr, however written) reaches no configure line: CUDA
    under /usr (the distribution's toolkit) gives the plugin and Open MPI a bare --with-cuda."""
    (recipe_dir / "c.yaml").write_text(
        "extends: a100\ncuda: {version: 12.8.1, home: //usr/}\n"
        "components:\n  efa: {version: 1.43.2}\n  aws_ofi_nccl: {source: release, version: 1.16.3}\n"
        "  openmpi: {source: source, version: 4.1.6}\n  mpi4py: null\n  nccl_tests: null\n"
    )
    text = _dockerfile(resolve(recipe.load(recipe_dir / "c.yaml"), lookup_torch=None))
    assert _configure_line(text, "aws-ofi-nccl") == (
        "./configure --prefix=/opt/aws-ofi-nccl --with-libfabric=/opt/amazon/efa --with-cuda "
        "--with-mpi=/opt/openmpi --enable-platform-aws --with-hwloc"
    )
    assert _configure_line(text, "openmpi-4.1.6").endswith("--with-hwloc --with-cuda")
    assert SYSTEM_WITH.findall(text) == []


def test_with_prefix_is_the_one_rule() -> None:
    from imgbuild.blocks._core import with_prefix

    assert [with_prefix("x", p) for p in ("/usr", "/usr/", "//usr", "/usr/.", None)] == ["--with-x"] * 5
    assert with_prefix("mpi", "/usr/lib/x86_64-linux-gnu/openmpi") == "--with-mpi=/usr/lib/x86_64-linux-gnu/openmpi"
    assert with_prefix("cuda", "/usr/local/cuda") == "--with-cuda=/usr/local/cuda"
    src = REPO / "src" / "imgbuild"
    written = [
        str(p.relative_to(REPO))
        for p in sorted([*src.rglob("*.py"), *src.rglob("*.j2")])
        if p.name != "_core.py" and re.search(r"""["']--with-[a-z]""", p.read_text())
    ]
    assert written == [], "a --with-X argument made outside blocks._core.with_prefix"


def test_only_the_hwloc_block_and_the_registry_name_hwloc() -> None:
    """Adding hwloc touched only its own folder and the registry's list: no other module or template of the package
    names it (core/distro.py's distribution table is data: the versions each release ships)."""
    src = REPO / "src" / "imgbuild"
    allowed = {src / "blocks" / "registry.py", src / "core" / "distro.py"}
    naming = [
        str(p.relative_to(REPO))
        for p in sorted([*src.rglob("*.py"), *src.rglob("*.j2"), *(REPO / "images").rglob("*.j2")])
        if p not in allowed and src / "blocks" / "hwloc" not in p.parents and "hwloc" in p.read_text().lower()
    ]
    assert naming == []


def test_render_and_the_skeleton_name_no_block() -> None:
    """Dockerfile.j2 and render.py ask the blocks generically (post_install lines, tag specs, offers): no Jinja
    expression of the skeleton and no string in render names a block (its comments may)."""
    skeleton = " ".join(re.findall(r"\{[{%](.*?)[}%]\}", (REPO / "images" / "Dockerfile.j2").read_text(), re.S))
    code = (REPO / "src" / "imgbuild" / "image" / "render.py").read_text()
    for block in REGISTRY:
        assert not re.search(rf"\b(has_)?{block.name}\b", skeleton), block.name
        assert f'"{block.name}"' not in code, block.name


def test_post_install_lines_follow_the_runtime_apt_install(recipe_dir: Path) -> None:
    text = _dockerfile(_resolved("cpu"))
    assert "      python3-mpi4py \\\n && rm -f /etc/ssh/ssh_host_* \\\n" in text
    (recipe_dir / "nossh.yaml").write_text("extends: cpu\ncomponents: {sshd: null, sagemaker: null}\n")
    text = _dockerfile(resolve(recipe.load(recipe_dir / "nossh.yaml"), lookup_torch=None))
    assert "ssh_host_" not in text and "      python3-mpi4py \\\n && mkdir -p /etc/imgbuild" in text


def test_copy_to_runtime_is_written_once() -> None:
    templates = Path(render.TEMPLATE_DIR)
    copies = [p.name for p in templates.glob("*.j2") if "COPY --from=builder" in p.read_text()]
    assert copies == ["_build.j2"]
    # Every download goes through `download` (tests/test_download_verify.py: its sha256 check).
    downloads = [p.name for p in templates.glob("*.j2") if "curl " in p.read_text()]
    assert downloads == ["_build.j2"]


def test_hwloc_check_reads_the_loader_cache_and_the_package_version() -> None:
    from imgbuild.blocks import hwloc
    from imgbuild.checks import Ran

    class Ctx:
        def __init__(self, pinned: str, ldconfig: str) -> None:
            self.pinned, self.ldconfig = pinned, ldconfig

        def version(self, name: str) -> str:
            return self.pinned

        def run(self, cmd: str, **kwargs) -> Ran:
            if cmd.startswith("ldconfig"):
                return Ran(0 if self.ldconfig else 1, self.ldconfig, "")
            return Ran(0, "2.7.0-2ubuntu1", "")

    lib = "\tlibhwloc.so.15 (libc6,x86-64) => /lib/x86_64-linux-gnu/libhwloc.so.15\n"
    assert hwloc.hwloc_library(Ctx("2.7.0", lib)).status == "pass"
    assert hwloc.hwloc_library(Ctx("2.9.0", lib)).status == "fail"
    missing = hwloc.hwloc_library(Ctx("2.7.0", ""))
    assert missing.status == "fail" and missing.found == "missing"


def test_the_build_fails_when_configure_left_gdrcopy_out(tmp_path: Path) -> None:
    """The plugin's release build checks configure's header after ./configure whenever the image has GDRCopy and the
    release takes --with-gdrcopy (whatever the arguments say: without the option, configure does not find gdrapi.h,
    HAVE_GDRCOPY is 0, and the build stops naming why). The rendered command, run on both headers configure writes."""
    import subprocess

    from imgbuild.blocks import aws_ofi_nccl

    text = _dockerfile(_resolved("ofi-release-gdrcopy"))
    checks = [line for line in text.splitlines() if "HAVE_GDRCOPY" in line]
    assert len(checks) == 1
    at = text.index(checks[0])
    assert text.index("./configure --prefix=/opt/aws-ofi-nccl") < at < text.index('make -j"$(nproc)" \\', at)
    assert "HAVE_GDRCOPY" not in _dockerfile(_resolved("ofi-release"))  # 1.16.3's configure has no --with-gdrcopy
    command = checks[0].strip().removeprefix("&& ").removesuffix(" \\")
    (tmp_path / "include").mkdir()
    for value, code in ((1, 0), (0, 1)):
        (tmp_path / aws_ofi_nccl.CONFIG_HEADER).write_text(f"/* x */\n#define HAVE_GDRCOPY {value}\n")
        ran = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True)
        assert ran.returncode == code, ran.stderr
    assert (
        "aws-ofi-nccl 1.21.1: configure did not enable GDRCopy (HAVE_GDRCOPY is not 1 in include/config.h" in ran.stderr
    )


def test_package_record_written_when_only_python_brings_packages(recipe_dir: Path) -> None:
    """An image whose only distribution packages are Python's (the layer under the OS packages) still records every
    installed package for `imgbuild sbom`."""
    (recipe_dir / "bare.yaml").write_text(
        "extends: pytorch\nos: {packages: []}\n"
        "components: {libfabric: null, openmpi: null, mpi4py: null, sshd: null, sagemaker: null}\n"
    )
    text = _dockerfile(resolve(recipe.load(recipe_dir / "bare.yaml"), lookup_torch=None))
    runtime = text.split("AS runtime")[1]
    assert runtime.index("      python3-venv\n") < runtime.index("torch==2.9.1") < runtime.index("dpkg-sha256.tsv")
