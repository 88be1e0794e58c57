"""Rendering: a resolved recipe -> a BuildPlan (Dockerfile text, context files, labels, tags: the image's names are
imgbuild.image.identity's): the Jinja environment, each block's fragments, the image's env and labels, and its
manifest. What the templates write a step with (mounts, pip and uv installs, apt, offline and stand-in helpers) is
imgbuild.image.dockerfile's.

A pure function of its input: no Docker, no network, no clock, byte-for-byte stable (mappings are sorted).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cache
from typing import TYPE_CHECKING, NamedTuple

from imgbuild.blocks import (
    BY_NAME,
    REGISTRY,
    TEMPLATE_DIR,
    Context,
    Contribution,
    Pin,
    ShipsFiles,
    UserCode,
    builder_base,
    builder_order,
    context_for,
    dedupe,
    runtime_order,
)
from imgbuild.core import instances, paths, platforms
from imgbuild.core.errors import RenderError
from imgbuild.image import dockerfile, identity
from imgbuild.image.launch import for_manifest
from imgbuild.image.manifest import Manifest
from imgbuild.pin import record
from imgbuild.pin.resolver import Resolved
from imgbuild.recipe import Runtime

if TYPE_CHECKING:
    import jinja2

    from imgbuild.image.identity import Identity


BLOCK_DIR = TEMPLATE_DIR  # the blocks' modules; their static files (scripts) are under <block>/files/
BASE_BUILD_DISK_GB = 2.0  # an image without big blocks: the base, OS packages, small downloads


@dataclass(frozen=True)
class ContextFile:
    """A file the Dockerfile copies, with its mode (the mode travels in the context: no COPY --chmod)."""

    path: str
    content: bytes
    mode: int = 0o644


@dataclass(frozen=True)
class Provenance:
    """Where a recipe comes from, for the image's org.opencontainers.image.source and .revision labels: read from
    git by the command that renders (image.provenance.of), passed in, so `plan` stays a pure function. None where
    it is not known (no repository, no remote, uncommitted changes): the label is left out, never guessed."""

    source: str | None = None  # the repository's URL
    revision: str | None = None  # the commit that last changed the recipe, its parents or its lock


@dataclass(frozen=True)
class BuildPlan:
    """Everything a build needs, decided before any engine is touched."""

    recipe: str
    dockerfile: str
    files: tuple[ContextFile, ...]
    labels: dict[str, str]
    lock_digest: str
    repository: str
    tags: tuple[str, ...]  # content-addressed first, then readable
    base_images: tuple[str, ...]
    manifest: Manifest | None = None  # what /etc/imgbuild/manifest.json holds (also among `files`)
    disk_gb: float = BASE_BUILD_DISK_GB  # free disk the engine needs to build it (see build.check_disk)
    # The distribution packages each base's stages install (base ref -> names): what `sources fetch` downloads.
    apt_packages: dict[str, tuple[str, ...]] = field(default_factory=dict)
    offline: bool = False  # rendered for `build --sources` (everything from dockerfile.SOURCES_CONTEXT, no network)
    arch: str = "amd64"  # the CPU architecture (one of the recipe's platform.arch); the build's --platform

    @property
    def image_refs(self) -> list[str]:
        return [f"{self.repository}:{t}" for t in self.tags]


def requirement_files(ctx: Context) -> list[ContextFile]:
    """The requirements file of every set the lock records (`dockerfile.pip_install` mounts them)."""
    python = ctx.content.python if ctx.content is not None else {}
    return [
        ContextFile(dockerfile.requirements_path(name), ctx.content.requirements_text(name).encode()) for name in python
    ]


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    """Templates compiled by earlier runs, kept in the state folder: compiling the skeleton and every block's
    fragments is most of what `render` and `show` spend beyond imports (about 60 ms here). Jinja checks each entry
    against its template's source checksum and its own and Python's versions, so an edited template is compiled
    again. The entries are code this process will run: none is read from a folder this user does not own or that
    others can write to (IMGBUILD_STATE_DIR set to a shared folder); there, or where the folder cannot be made
    (IMGBUILD_STATE_DIR naming a file, a symlink loop, a folder under /proc: a warning on stderr says so), templates
    are compiled each time, as without a cache: the cache is never a reason for render to fail."""
    import jinja2

    folder = paths.state_dir() / "jinja"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = folder.stat()
    except OSError as exc:
        why = "it is not a folder" if isinstance(exc, FileExistsError) else exc.strerror or str(exc)
        print(
            f"imgbuild: warning: {paths.state_dir_named()}: cannot keep compiled templates in {folder} ({why}); "
            "rendering without that cache",
            file=sys.stderr,
        )
        return None
    if st.st_uid != os.geteuid() or st.st_mode & 0o022 or not os.access(folder, os.W_OK):
        return None
    return jinja2.FileSystemBytecodeCache(str(folder), f"jinja2-{jinja2.__version__}-%s.cache")


@cache
def environment(offline: bool = False, local_files: frozenset[str] = frozenset()) -> jinja2.Environment:
    """The one Jinja environment: StrictUndefined, so a missing variable is an error, not an empty string.
    jinja2 is imported here, not at the top: `show` and `run` need the image's references, not its templates.
    `offline`: everything from dockerfile.SOURCES_DIR (`build --sources`); `local_files`: the downloads (by file
    name) that `--files` found, copied from SOURCES_DIR/files/ by `download`, the rest fetched as usual (the
    globals and filters are dockerfile.template_globals' and template_filters')."""
    import jinja2

    env = jinja2.Environment(
        # images/ holds the Dockerfile skeleton and the files it copies; each block's fragments sit next to its
        # module (imgbuild/blocks/<name>.j2) and load as blocks/<name>.j2.
        loader=jinja2.ChoiceLoader(
            [
                jinja2.PrefixLoader({"blocks": jinja2.FileSystemLoader(str(TEMPLATE_DIR))}),
                jinja2.FileSystemLoader(str(paths.images_dir())),
            ]
        ),
        undefined=jinja2.StrictUndefined,
        bytecode_cache=_bytecode_cache(),
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters.update(dockerfile.template_filters())
    env.globals.update(dockerfile.template_globals(offline, local_files))
    for block in REGISTRY:
        env.globals.update(block.template_globals)
    return env


def contributions(resolved: Resolved, arch: str | None = None) -> tuple[Context, dict[str, Contribution]]:
    """Every pinned block's contribution for `arch` (default: the recipe's first), and the context with what they
    ask of the builder."""
    ctx = context_for(resolved, arch)
    contribs = {b.name: b.contribution(resolved.pins[b.name], ctx) for b in REGISTRY if b.name in resolved.pins}
    in_builder = any(c.needs_fabric_in_builder for c in contribs.values())
    if in_builder:  # again, with the context saying so: what brings the fabric adds its builder part (headers)
        ctx = replace(ctx, fabric_in_builder=True)
        contribs = {b.name: b.contribution(resolved.pins[b.name], ctx) for b in REGISTRY if b.name in resolved.pins}
    offered: dict[str, list[str]] = {}
    for c in contribs.values():  # registry order
        for consumer, args in c.offers.items():
            offered.setdefault(consumer, []).extend(args)
    offers = {consumer: tuple(dedupe(args)) for consumer, args in offered.items() if consumer in resolved.pins}
    return replace(ctx, fabric_in_builder=in_builder, offers=offers), contribs


def plan(
    resolved: Resolved,
    provenance: Provenance | None = None,
    *,
    offline: bool = False,
    arch: str | None = None,
    local_files: Iterable[str] = (),
) -> BuildPlan:
    """Render the Dockerfile and the context files of a resolved recipe (`provenance`: its source and revision
    labels, when the caller knows them; `offline`: for a build from a sources folder with no network,
    dockerfile.SOURCES_DIR; `arch`: which of the recipe's architectures, default its first; `local_files`: the file
    names of the downloads a `--files` folder holds, copied from the context's SOURCES_CONTEXT/files/ rather than
    fetched)."""
    import jinja2

    arch = identity.check_arch(resolved, arch)
    ctx, contribs = contributions(resolved, arch)
    named = identity.of(resolved)  # the lock and the user's code read once: labels, manifest and tags name one reading
    digest, digests = named.lock_digest, named.digests
    labels = _labels(resolved, digest, provenance or Provenance(), digests)
    manifest = _manifest(resolved, digest, contribs, arch, digests)
    packages = stage_packages(resolved, contribs)
    apt: dict[str, set[str]] = {}
    apt.setdefault(builder_base(resolved), set()).update(packages.builder)
    if packages.runtime_all:
        apt.setdefault(resolved.base_ref, set()).update(packages.runtime_all)
    try:
        env = environment(offline, frozenset(local_files))
        files = _files(resolved, ctx, contribs, manifest, env)
        if offline:
            apt_files = [f for ref in apt for f in dockerfile.offline_apt_files(ref)]
            files += [ContextFile(path, text.encode()) for path, text in apt_files]
        text = _dockerfile(resolved, ctx, contribs, labels, env)
    except jinja2.TemplateError as exc:
        where = f"{exc.filename}:{exc.lineno}" if isinstance(exc, jinja2.TemplateSyntaxError) else "template"
        raise RenderError(f"rendering {resolved.name} failed in {where}: {exc}") from None
    bases = record.bases(resolved)
    return BuildPlan(
        recipe=resolved.name,
        dockerfile=text,
        files=tuple(sorted(files, key=lambda f: f.path)),
        labels=labels,
        lock_digest=digest,
        repository=named.repository,
        tags=named.tags(arch),
        arch=arch,
        base_images=tuple(bases),
        manifest=manifest,
        disk_gb=BASE_BUILD_DISK_GB + sum(c.build_disk_gb for c in contribs.values()),
        apt_packages={ref: tuple(sorted(pkgs)) for ref, pkgs in apt.items()},
        offline=offline,
    )


def _fragments(resolved: Resolved, ctx: Context, env: jinja2.Environment) -> dict[str, dict[str, str]]:
    """Each pinned block's rendered `builder` and `runtime` fragments; a source mode that should render and
    renders nothing (or a mode the block doesn't declare) is an error, never an empty layer."""
    import jinja2

    r, pins = resolved.recipe, resolved.pins
    out: dict[str, dict[str, str]] = {}
    for block in REGISTRY:
        pin = pins.get(block.name)
        if pin is None:
            continue
        provides = block.modes.get(pin.source)
        if provides is None:
            raise RenderError(
                f"{r.name}: components.{block.name}: source '{pin.source}' is not one the block renders "
                f"(it has: {', '.join(block.modes)})"
            )
        try:
            module = env.get_template(block.template).module
        except jinja2.TemplateNotFound:
            module = None
        texts = {}
        for macro in ("builder", "runtime", "final"):
            fn = getattr(module, macro, None)
            texts[macro] = str(fn(pin=pin, ctx=ctx, r=r, pins=pins)).strip("\n") if fn is not None else ""
        if provides == "fragment" and not any(texts.values()):
            raise RenderError(
                f"{r.name}: components.{block.name}: source '{pin.source}' renders nothing from {block.template}"
            )
        out[block.name] = texts
    return out


def image_env(resolved: Resolved, contribs: dict[str, Contribution]) -> tuple[dict[str, list[str]], dict[str, str]]:
    """What the image's ENV instructions set: PATH / LD_LIBRARY_PATH entries (blocks in layer order) and the
    blocks' variables, those the NVIDIA target's instance types ask for (instances.instance_env: NCCL's NVLink across
    GB200 trays) and the recipe's (the recipe's win)."""
    r = resolved.recipe
    ordered = [contribs[n] for n in runtime_order() if n in contribs]
    env_paths = {
        "PATH": dedupe([p for c in ordered for p in c.path]),
        "LD_LIBRARY_PATH": dedupe([p for c in ordered for p in c.ld_library_path]),
    }
    component_env = {k: v for c in ordered for k, v in c.env.items()}
    interconnect = instances.instance_env(r.platform.instance_types) if r.platform.accelerator == "nvidia" else {}
    return env_paths, dict(sorted({**component_env, **interconnect, **r.env}.items()))


class StagePackages(NamedTuple):
    """The distribution packages of each apt layer, sorted: the builder stage's, the runtime stage's first layer (the
    packages of the blocks that go under the OS packages: `Block.under_os_packages`) and its OS-package layer (the
    rest: the recipe's `os.packages` and every other block's)."""

    builder: list[str]
    runtime_first: list[str]
    runtime: list[str]

    @property
    def runtime_all(self) -> list[str]:
        return sorted({*self.runtime_first, *self.runtime})


def stage_packages(resolved: Resolved, contribs: dict[str, Contribution]) -> StagePackages:
    """The distribution packages of the builder stage and of the runtime stage's two apt layers."""
    first = set().union(*(c.runtime_packages for name, c in contribs.items() if BY_NAME[name].under_os_packages))
    runtime_pkgs = set(resolved.recipe.os.packages).union(*(c.runtime_packages for c in contribs.values()))
    # The builder installs only what downloads and compiles need; the runtime stage gets the rest.
    builder_pkgs = {"ca-certificates"}.union(*(c.builder_packages for c in contribs.values()))
    return StagePackages(sorted(builder_pkgs), sorted(first), sorted(runtime_pkgs - first))


def _dockerfile(
    resolved: Resolved,
    ctx: Context,
    contribs: dict[str, Contribution],
    labels: dict[str, str],
    env: jinja2.Environment,
) -> str:
    r = resolved.recipe
    fragments = _fragments(resolved, ctx, env)
    builder = [f for name in builder_order() if (f := fragments.get(name, {}).get("builder"))]
    first: list[str] = []
    runtime: list[str] = []
    for name in runtime_order():
        if f := fragments.get(name, {}).get("runtime"):
            (first if BY_NAME[name].under_os_packages else runtime).append(f)
    final = [f for name in runtime_order() if (f := fragments.get(name, {}).get("final"))]
    packages = stage_packages(resolved, contribs)
    env_paths, recipe_env = image_env(resolved, contribs)
    return env.get_template("Dockerfile.j2").render(
        resolved=resolved,
        r=r,
        ctx=ctx,
        builder_base=builder_base(resolved),
        builder=builder,
        runtime_first=first,
        runtime=runtime,
        final=final,
        builder_packages=packages.builder,
        runtime_first_packages=packages.runtime_first,
        runtime_packages=packages.runtime,
        env_paths=env_paths,
        env=recipe_env,
        labels=dict(sorted(labels.items())),
        pinned=lambda ref: pinned_ref(resolved, ref, ctx.arch),
        builder_env={**dockerfile.CA_ENV, **dockerfile.PIP_QUIET},
        post_install=[line for name in runtime_order() if name in contribs for line in contribs[name].post_install],
        stubs={k: v for c in contribs.values() for k, v in c.stub_packages.items()},
    )


def pinned_ref(resolved: Resolved, ref: str, arch: str | None = None) -> str:
    """A base reference as FROM names it for `arch`: with the digest the lock records for it (`image:tag@sha256:...`;
    a registry's digest of a multi-architecture image is its index's, one for every architecture), so the build
    starts from those bytes or fails; as it is where no digest was established, and, for a base made on this machine
    (local: see imgbuild.pin.digests), the engine's name of that architecture's copy (Content.engine_ref)."""
    content = resolved.content
    recorded = content.bases.get(ref) if content is not None else None
    if content is None or recorded is None or "@" in ref:
        return ref
    if recorded.digest is None:
        return content.engine_ref(ref, arch or resolved.recipe.platform.arch[0])
    return f"{ref}@{recorded.digest}"


def _labels(
    resolved: Resolved, digest: str, provenance: Provenance | None, digests: Mapping[str, str]
) -> dict[str, str]:
    """The image's labels: OCI's annotations (github.com/opencontainers/image-spec, annotations.md) and imgbuild's.
    Only what the lock and the caller establish: `created` is the lock's time (a rebuild from one lock makes the
    same image), `base.digest` the base's digest the lock recorded; each is left out when unknown. `digests`: what
    the image holds beyond the lock (identity.image_digests)."""
    r = resolved.recipe
    provenance = provenance or Provenance()
    base = resolved.content.bases.get(resolved.base_ref) if resolved.content is not None else None
    optional = {
        "org.opencontainers.image.created": resolved.locked_at,
        "org.opencontainers.image.base.digest": base.digest if base is not None else None,
        "org.opencontainers.image.licenses": r.license,
        "org.opencontainers.image.source": provenance.source,
        "org.opencontainers.image.revision": provenance.revision,
    }
    labels = {
        "org.opencontainers.image.title": f"imgbuild/{r.name}",
        "org.opencontainers.image.description": r.description,
        "org.opencontainers.image.base.name": resolved.base_ref,
        "org.opencontainers.image.version": identity.readable_tag(resolved),
        **{k: v for k, v in optional.items() if v},
        "io.imgbuild.recipe": r.name,
        "io.imgbuild.lock-digest": digest,
    }
    code = identity.code_digest(digests)
    if code is not None:
        labels["io.imgbuild.code-digest"] = code
    for name, pin in resolved.pins.items():
        if pin.version and name != "base":
            labels[f"io.imgbuild.component.{name}"] = pin.version
    labels.update(r.labels)
    return labels


def manifest(resolved: Resolved, named: Identity, arch: str | None = None) -> Manifest:
    """The manifest the image of `resolved` for `arch` (default: the recipe's first) carries (no template is
    rendered). `named` is the image's identity (identity.of(resolved)), read once by the caller: its lock digest and
    what the image holds beyond the lock are the manifest's, never read again here."""
    arch = named.check_arch(arch)
    _, contribs = contributions(resolved, arch)
    return _manifest(resolved, named.lock_digest, contribs, arch, named.digests)


def _manifest(
    resolved: Resolved, digest: str, contribs: dict[str, Contribution], arch: str, digests: Mapping[str, str]
) -> Manifest:
    r = resolved.recipe
    env_paths, env = image_env(resolved, contribs)
    return Manifest(
        recipe=r.name,
        recipe_digest=resolved.recipe_digest,
        lock_digest=digest,
        base=resolved.base_ref,
        platform=r.platform,
        arch=arch,  # one of platform.arch (identity.check_arch)
        components={n: _for_arch(resolved.pins[n], arch) for n in sorted(contribs)},
        env=dict(sorted(r.env.items())),
        image_env=tuple(sorted([*(name for name, paths in env_paths.items() if paths), *env])),
        mpirun=r.mpirun,
        runtime=runtime_profile(r.runtime, contribs),
        **{
            b.name: e
            for b in REGISTRY
            if b.name in resolved.pins and isinstance(b, UserCode)
            if (e := b.manifest_entry(resolved.pins[b.name], resolved, digests.get(b.name)))
        },
    )


def _for_arch(pin: Pin, arch: str) -> Pin:
    """A pin as `arch`'s image has it: a prefix in the architecture's multiarch directory filled in
    (platforms.for_arch), so the manifest names the image's own paths."""
    prefix = pin.details.prefix
    if not prefix or platforms.MULTIARCH not in prefix:
        return pin
    return pin.model_copy(
        update={"details": pin.details.model_copy(update={"prefix": platforms.for_arch(prefix, arch)})}
    )


def runtime_profile(runtime: Runtime, contribs: dict[str, Contribution]) -> Runtime:
    """The recipe's `runtime:` section with the device nodes the blocks give containers where the host has them."""
    extra = [d for c in contribs.values() for d in c.host_devices]
    if not extra:
        return runtime
    return runtime.model_copy(update={"host_devices": tuple(dict.fromkeys([*runtime.host_devices, *extra]))})


def _files(
    resolved: Resolved,
    ctx: Context,
    contribs: dict[str, Contribution],
    manifest: Manifest,
    env: jinja2.Environment,
) -> list[ContextFile]:
    """The context files: the manifest, the entrypoint (static; it runs the hooks blocks put in
    paths.ENTRYPOINT_D), and each block's `files` (templates rendered, static files as they are) and `data`."""
    r, pins = resolved.recipe, resolved.pins
    entrypoint = (paths.images_dir() / "files" / "imgbuild-entrypoint").read_bytes()
    files = [
        ContextFile("imgbuild/manifest.json", manifest.to_json().encode()),
        ContextFile("imgbuild/imgbuild-entrypoint", entrypoint, 0o755),
        *requirement_files(ctx),
    ]
    variables = {"r": r, "ctx": ctx, "pins": pins, "manifest": manifest}
    launch = for_manifest(manifest)  # the launch lines a block's data files may hold, made once
    for block in REGISTRY:
        if block.name not in pins:
            continue
        if isinstance(block, ShipsFiles):
            for path, source, mode in block.files:
                if source.endswith(".j2"):
                    content = env.get_template(source).render(**variables).encode()
                else:
                    content = (BLOCK_DIR / source).read_bytes()
                files.append(ContextFile(path, content, mode))
            for path, text in block.data(pins[block.name], manifest, launch).items():
                files.append(ContextFile(path, text.encode()))
        if isinstance(block, UserCode):
            files += [ContextFile(path, data, mode) for path, data, mode in block.context(pins[block.name], ctx)]
    return files
