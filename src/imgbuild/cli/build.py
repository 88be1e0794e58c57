"""`imgbuild build`, `imgbuild base bootstrap` and `imgbuild doctor`: the commands that make images in the engine,
and the check of what they need."""

from pathlib import Path
from typing import Annotated

import typer

from imgbuild.cli.console import FilesOption, RecipeArg, err, handled, out, platform_arch, print_json, resolved
from imgbuild.core.interrupts import terminable

base_app = typer.Typer(help="Base images built offline from a Debian or Ubuntu archive.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add `build`, `doctor` and the `base` group to `app`."""
    app.command("build")(build_)
    app.add_typer(sources_app, name="sources")
    app.add_typer(base_app, name="base")
    app.command("doctor")(doctor)


def _build_args(values: list[str] | None) -> list[str] | None:
    """--build-arg KEY=VALUE: anything else is a usage error (exit 2) before the recipe is read."""
    from imgbuild.build.command import parse_build_args
    from imgbuild.core.errors import BuildError

    try:
        parse_build_args(values or [])
    except BuildError as exc:
        raise typer.BadParameter(exc.message) from None
    return values


def _ca_bundle(value: Path | None) -> Path | None:
    """--ca-bundle / IMGBUILD_CA_BUNDLE: a readable PEM file, else a usage error (exit 2) before anything is built."""
    if value is None:
        return None
    from imgbuild.build import dockercontext
    from imgbuild.core.errors import BuildError

    try:
        dockercontext.read_ca_bundle(value)
    except BuildError as exc:
        raise typer.BadParameter(exc.message) from None
    return value


_BUILDER_NAME_RE = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}"


def _builder_name(value: str | None) -> str | None:
    """--builder / IMGBUILD_BUILDER: a buildx builder's name (letters, digits, `_ . -`), else a usage error."""
    import re

    if value is None or value == "":
        return None
    if not re.fullmatch(_BUILDER_NAME_RE, value):
        raise typer.BadParameter(f"expected a buildx builder name (letters, digits, '_', '.', '-'), got {value[:80]!r}")
    return value


def _cache_refs(values: list[str] | None) -> list[str] | None:
    """--cache-from REF (repeatable): each a Docker image reference, else a usage error naming the option."""
    from imgbuild.build import builders

    for value in values or []:
        if problem := builders.cache_ref_problem(value, "--cache-from"):
            raise typer.BadParameter(problem)
    return values


def _cache_to(value: str | None) -> str | None:
    """--cache-to REF: an image reference with a tag (no digest), else a usage error naming the option."""
    from imgbuild.build import builders

    if value is not None and (problem := builders.cache_ref_problem(value, "--cache-to")):
        raise typer.BadParameter(problem)
    return value


@handled
@terminable
def build_(
    ref: RecipeArg,
    tag: Annotated[list[str] | None, typer.Option("--tag", "-t", help="Extra image reference(s) to tag.")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Build every step again.")] = False,
    pull: Annotated[bool, typer.Option("--pull/--no-pull", help="Try to pull newer base images.")] = False,
    build_arg: Annotated[
        list[str] | None, typer.Option("--build-arg", help="KEY=VALUE, repeatable.", callback=_build_args)
    ] = None,
    ca_bundle: Annotated[
        Path | None,
        typer.Option(
            "--ca-bundle",
            envvar="IMGBUILD_CA_BUNDLE",
            callback=_ca_bundle,
            help="PEM bundle that downloads during the build trust (TLS-intercepting proxies), added to "
            "certifi's roots. A BuildKit build secret: never in a layer of the image.",
        ),
    ] = None,
    builder: Annotated[
        str | None,
        typer.Option(
            "--builder",
            envvar="IMGBUILD_BUILDER",
            callback=_builder_name,
            help="A buildx builder to build on (a remote BuildKit, buildx's Kubernetes driver ...); needs the "
            "buildx plugin. Default: the CLI's current builder, else its own BuildKit.",
        ),
    ] = None,
    cache_from: Annotated[
        list[str] | None,
        typer.Option(
            "--cache-from",
            callback=_cache_refs,
            help="Registry ref of a build cache to start from (repeatable): a registry cache where buildx has a "
            "driver that exports one, else an image built with an inline cache.",
        ),
    ] = None,
    cache_to: Annotated[
        str | None,
        typer.Option(
            "--cache-to",
            callback=_cache_to,
            help="Registry ref to write this build's cache to (registry cache with mode=max, else the image with "
            "its inline cache, pushed there).",
        ),
    ] = None,
    sources: Annotated[
        Path | None,
        typer.Option(
            "--sources",
            help="Build from a folder `imgbuild sources fetch` wrote, with the build's network off (air-gapped "
            "sites). Every file is checked against the lock first; a missing or changed one is exit 16.",
        ),
    ] = None,
    platform: Annotated[
        str | None,
        typer.Option(
            "--platform",
            callback=platform_arch,
            help="linux/amd64 or linux/arm64: one of the recipe's platform.arch (default its first). Another "
            "architecture than this machine's builds under QEMU (scripts/setup.sh sets it up) and is tagged "
            "<tag>-<arch>, e.g. imgbuild/cpu:lock-<12 hex>-arm64.",
        ),
    ] = None,
    files: FilesOption = None,
) -> None:
    """Build a recipe's image with BuildKit on the Docker engine (DOCKER_HOST, a docker context, or the local
    socket); `imgbuild doctor` says which builder is used and why."""
    from imgbuild.build import command
    from imgbuild.ui.progress import BuildProgress

    loaded, res = resolved(ref)  # the recipe and its lock, read once (exit 4 without one) and handed down
    progress = BuildProgress.auto(err())
    result = command.build(
        loaded,
        res,
        extra_tags=tag or [],
        nocache=no_cache,
        pull=pull,
        build_args=command.parse_build_args(build_arg or []),
        ca_bundle=command.ca_bundle_from(ca_bundle),
        progress=progress,
        builder_name=builder,
        cache_from=cache_from or [],
        cache_to=cache_to,
        sources=sources,
        arch=platform,
        files=files,
    )
    for w in result.warnings:
        err().print(f"imgbuild: warning: {w}", markup=False)
    out().print(f"built {result.image_id}" + (f" (digest {result.digest})" if result.digest else ""), markup=False)
    for ref_ in result.refs:
        out().print(f"  {ref_}", markup=False)
    if result.builder is not None:
        out().print(f"builder: {result.builder.describe()}", markup=False)
    out().print(f"cache: {result.cache}", markup=False)
    if result.cache_pushed:
        out().print(f"cache pushed: {result.cache_pushed}", markup=False)
    out().print(
        f"{result.steps_run} of {result.steps_total} steps run, {result.steps_cached} cached, in "
        f"{result.duration_s:.1f}s; log: {result.log_path}",
        markup=False,
    )


@base_app.command("bootstrap")
@handled
def base_bootstrap(
    name: Annotated[str, typer.Argument(help="Image name to create, e.g. debian:bookworm-slim or ubuntu:22.04.")],
    suite: Annotated[str | None, typer.Option(help="Archive suite (bookworm, jammy...); implied by NAME.")] = None,
    mirror: Annotated[str | None, typer.Option(help="Archive mirror URL; the distribution's default.")] = None,
    variant: Annotated[str, typer.Option(help="debootstrap variant.")] = "minbase",
    platform: Annotated[
        str | None,
        typer.Option(
            "--platform",
            callback=platform_arch,
            help="linux/amd64 (default) or linux/arm64: another architecture than this machine's is bootstrapped "
            "under QEMU (scripts/setup.sh sets it up) and named NAME-<arch>, e.g. debian:bookworm-slim-arm64.",
        ),
    ] = None,
) -> None:
    """Build a base image with debootstrap and import it into the engine under NAME (air-gapped sites)."""
    from imgbuild.core import platforms
    from imgbuild.engine import client as engine
    from imgbuild.engine import rootfs

    spec = rootfs.spec_for(name, suite=suite, mirror=mirror, variant=variant, arch=platform or platforms.DEFAULT_ARCH)
    client = engine.connect()
    try:
        image_id = rootfs.bootstrap_base(client, spec, progress_print=lambda s: err().print(s, markup=False))
    finally:
        client.close()
    out().print(f"{spec.image_name} {image_id}", markup=False)


# The instance types whose GPUs share an NVLink domain across instances (AWS's P6e UltraServers: GB200 NVL72), so
# their jobs need IMEX channels: AWS's EKS guide for P6e-GB200 (ComputeDomain per job). That every p6e-gb* type is
# one is inferred from AWS selling P6e only as UltraServers.
NVL_INSTANCE_PREFIX = "p6e-gb"


@handled
def doctor(
    refs: Annotated[
        list[str] | None, typer.Argument(help="Recipes to check for (default: every shipped recipe).")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="The findings as JSON on stdout (the same as the table; same exit code).")
    ] = False,
    builder: Annotated[
        str | None,
        typer.Option(
            "--builder", envvar="IMGBUILD_BUILDER", callback=_builder_name, help="The buildx builder to check for."
        ),
    ] = None,
) -> None:
    """Check the engine, the builder (which one `imgbuild build` uses and why), base images, container runtimes and
    host devices the recipes need, the host's NVIDIA driver against their images' CUDA, and IMEX channels."""
    from imgbuild import recipe
    from imgbuild.blocks.cuda import driver
    from imgbuild.build import builders
    from imgbuild.build import doctor as doc
    from imgbuild.core.errors import DoctorError
    from imgbuild.pin import lock

    names = refs or recipe.shipped_names()
    bases: dict[str, list[str]] = {}
    runtimes: dict[str, list[str]] = {}
    devices: dict[str, list[str]] = {}
    platforms: dict[str, list[str]] = {}
    cudas: dict[str, list[str]] = {}  # the CUDA of each recipe's image -> recipes (the host driver row)
    imex: list[str] = []
    for name in names:
        res, _ = lock.lock_or_fresh(recipe.load(name).concrete())  # what a recipe needs: a fresh one will do
        r = res.recipe
        bases.setdefault(res.base_ref, []).append(r.name)
        for arch in r.platform.arch:
            platforms.setdefault(arch, []).append(r.name)
        if r.runtime.runtime:
            runtimes.setdefault(r.runtime.runtime, []).append(r.name)
        if r.runtime.efa_devices:
            devices.setdefault("efa", []).append(r.name)
        if r.platform.accelerator == "gaudi":
            devices.setdefault("gaudi", []).append(r.name)
        if r.platform.accelerator == "nvidia":
            runtimes.setdefault("nvidia", []).append(r.name)
            devices.setdefault("nvidia-gpu", []).append(r.name)
            cuda = driver.image_cuda(res.pins)
            if cuda:
                cudas.setdefault(cuda, []).append(r.name)
            if any(t.startswith(NVL_INSTANCE_PREFIX) for t in r.platform.instance_types):
                imex.append(r.name)
    checks = doc.run_checks(
        base_images=bases,
        runtimes_needed=runtimes,
        devices_needed=devices,
        builder_select=lambda: builders.select(builder),
        platforms_needed=platforms,
        cuda_needed=cudas,
        imex_needed=imex,
    )
    bad = doc.failed(checks, set(names) if refs else None)
    if as_json:
        print_json(doc.to_json(checks, bad, names))
    else:
        doc.render_table(checks, out())
    if bad:
        raise DoctorError(
            f"missing for {', '.join(sorted({n for c in bad for n in c.needed_by} or {'all'}))}: "
            + "; ".join(f"{c.name} ({c.detail})" for c in bad)
        )


sources_app = typer.Typer(help="Everything a recipe's build fetches, for air-gapped sites.", no_args_is_help=True)


@sources_app.command("fetch")
@handled
@terminable
def sources_fetch(
    ref: RecipeArg,
    output: Annotated[Path, typer.Option("--output", "-o", help="A new (or empty) folder to fetch into.")],
) -> None:
    """Download and check everything a build of RECIPE's lock needs (tarballs, wheels, the distribution's packages,
    the base images) into a folder that `imgbuild build RECIPE --sources DIR` builds from with no network."""
    from imgbuild.build import sources
    from imgbuild.engine import client as engine

    _, res = resolved(ref)  # a recipe without a usable lock is exit 4 before the engine is asked for anything
    client = engine.connect()
    try:
        index = sources.fetch(res, output, client, say=lambda line: err().print(line, markup=False))
    finally:
        client.close()
    size = sum((output / rel).stat().st_size for rel in index.files)
    out().print(f"fetched {len(index.files)} files ({size / 1e6:.0f} MB) for {index.recipe} (lock "
                f"{index.lock_digest[:12]}) into {output}", markup=False)  # fmt: skip
