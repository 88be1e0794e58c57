"""`imgbuild build`, the command (`build`), and the checks before it (the disk, the platform, the base images):
lock -> plan -> a build context holding only what the Dockerfile copies -> BuildKit.

The builder is `builders.select`'s (buildx, else the docker CLI's own BuildKit). The context is a temporary folder
removed after the build whatever happens. The CA bundle downloads trust (certifi's roots, plus --ca-bundle or
IMGBUILD_CA_BUNDLE) is the build secret `dockerfile.CA_SECRET_ID`, written to a temporary folder outside the context and
removed afterwards: a secret mount never lands in a layer.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import imgbuild.build.builders as builders
import imgbuild.build.dockercontext as dockercontext
from imgbuild import __version__
from imgbuild.core import paths, platforms
from imgbuild.core.errors import BuildError, PushError, UsageError
from imgbuild.engine import client as engine
from imgbuild.image import dockerfile, provenance, render
from imgbuild.pin.resolver import Resolved
from imgbuild.recipe import LoadedRecipe


@dataclass(frozen=True)
class BuildResult:
    """What a finished build produced."""

    recipe: str
    image_id: str
    refs: tuple[str, ...]
    log_path: Path
    steps_total: int
    steps_run: int
    duration_s: float
    warnings: tuple[str, ...]
    steps_cached: int = 0
    steps: tuple[builders.StepRecord, ...] = ()
    digest: str | None = None
    builder: builders.Builder | None = None
    cache: str = ""  # which cache mode was used (`builders.Cache.describe`)
    cache_pushed: str | None = None  # REF@DIGEST of the inline cache --cache-to pushed


def ca_bundle_from(option: Path | None) -> Path | None:
    """--ca-bundle, else IMGBUILD_CA_BUNDLE, else none."""
    if option is not None:
        return option
    env = os.environ.get("IMGBUILD_CA_BUNDLE")
    return Path(env) if env else None


def parse_build_args(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BuildError(f"--build-arg {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


def check_disk(client: Any, plan: render.BuildPlan, *, free_bytes: int | None = None) -> None:
    """Refuse to start a build the engine's disk cannot hold, saying how much it needs and has.

    Checked only where it can be: an engine on this machine (its data root is a local path) and an image not
    already built under the plan's content-addressed tag (a rebuild from cache needs next to nothing).
    """
    if free_bytes is None:
        if os.environ.get("DOCKER_HOST", "unix://").split("://")[0] not in ("unix", ""):
            return
        if engine.inspect_image(client, plan.image_refs[0]) is not None:
            return
        root = str(client.info().get("DockerRootDir") or "/var/lib/docker")
        try:
            free_bytes = shutil.disk_usage(root).free
        except OSError:
            return  # the data root is not visible from here (engine in a VM): nothing to measure
    else:
        root = "the engine's data root"
    need = plan.disk_gb * 1e9
    if free_bytes < need:
        raise BuildError(
            f"building {plan.recipe} needs about {plan.disk_gb:.0f} GB free in {root} while its layers are "
            f"written and committed; {free_bytes / 1e9:.1f} GB is free",
            hint="free space (docker system prune, docker image prune -a) or give the engine a bigger disk",
        )


def engine_bases(resolved: Resolved, plan: render.BuildPlan) -> list[str]:
    """The names the engine holds the plan's bases under: a base made on this machine (recorded local in the lock)
    has one copy per architecture, `debian:bookworm-slim-arm64` beside `debian:bookworm-slim` (Content.engine_ref)."""
    content = resolved.content
    return [content.engine_ref(ref, plan.arch) if content is not None else ref for ref in plan.base_images]


def check_platform(client: Any, resolved: Resolved, plan: render.BuildPlan, *, engine_store: bool = True) -> None:
    """Before a build for another architecture than this machine's on this engine's builder (`engine_store`; a buildx
    builder of its own runs steps on its own machines): this machine must run its binaries (QEMU through binfmt_misc),
    and each local base must be in the engine recorded as that architecture (an image recorded as another makes
    BuildKit look the name up on Docker Hub). BuildError / BaseImageMissing saying what to run."""
    from imgbuild.core.errors import BaseImageMissing
    from imgbuild.engine import rootfs

    if not engine_store:  # a buildx builder of its own (remote, Kubernetes...) runs the steps on its own machines
        return
    platform = platforms.docker_platform(plan.arch)
    if problem := rootfs.emulation_problem(plan.arch):
        hint = rootfs.emulation_hint(plan.arch)
        raise BuildError(f"cannot build {plan.recipe} for {platform}: {problem}", hint=hint)
    for ref, name in zip(plan.base_images, engine_bases(resolved, plan), strict=True):
        if name == ref:
            continue
        record = engine.inspect_image(client, name)
        if record is None:
            raise BaseImageMissing(
                f"the {platform} base {name} (the {ref} of {plan.recipe}'s lock, made on this machine) is not in "
                "the engine",
                hint=f"imgbuild base bootstrap {ref} --platform {platform}  (debootstrap under QEMU, about 2 min)",
            )
        if (got := builders.image_platform(record)) != platform:
            raise BuildError(
                f"the engine records the base {name} as {got}, not {platform}: BuildKit would look it up on Docker "
                "Hub instead",
                hint=f"docker rmi {name}; imgbuild base bootstrap {ref} --platform {platform}",
            )


def log_folder(log_dir: Path | None) -> Path:
    """The folder of this build's log: `log_dir`, else `<state folder>/logs`, made before the engine is asked. A
    state folder that cannot hold it (IMGBUILD_STATE_DIR naming a file, a symlink loop, a folder under /proc or one
    this user cannot write) is a `UsageError` (exit 2) naming the variable and the folder: a build keeps its log."""
    if log_dir is not None:
        return log_dir
    folder = paths.state_dir() / "logs"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        why = "" if os.access(folder, os.W_OK | os.X_OK) else "this user cannot write there"
    except FileExistsError:
        why = "it is not a folder"
    except OSError as exc:
        why = exc.strerror or str(exc)
    if why:
        raise UsageError(
            f"{paths.state_dir_named()}: cannot keep the build log in {folder}: {why}",
            hint="set IMGBUILD_STATE_DIR to a folder you can write (default $XDG_CACHE_HOME/imgbuild, else "
            "~/.cache/imgbuild)",
        )
    return folder


def build(
    loaded: LoadedRecipe,
    resolved: Resolved,
    *,
    extra_tags: list[str] | None = None,
    nocache: bool = False,
    pull: bool = False,
    build_args: dict[str, str] | None = None,
    ca_bundle: Path | None = None,
    progress: builders.BuildObserver | None = None,
    log_dir: Path | None = None,
    builder_name: str | None = None,
    cache_from: list[str] | None = None,
    cache_to: str | None = None,
    builder: builders.Builder | None = None,
    sources: Path | None = None,
    arch: str | None = None,
    files: Path | None = None,
) -> BuildResult:
    """Build the image of recipe `loaded` from its lock `resolved` (the command's `lock.for_ref`: a recipe without a
    lock is refused there, no image from unpinned content) with BuildKit on the engine DOCKER_HOST (or the docker
    context, or the local socket) names. `builder_name` (--builder / IMGBUILD_BUILDER) picks a buildx builder;
    `cache_from` / `cache_to` are registry refs of the cache between machines (`builders.cache_plan`). `sources`: a
    folder `imgbuild sources fetch` wrote: checked, then built from alone with the build's network off
    (imgbuild.build.sources). `arch`: which of the recipe's platform.arch to build (default its first; `--platform
    linux/arm64`), tagged as `identity.Identity.tags` (`lock-<12 hex>-arm64` for an architecture other than the
    first); another architecture than this machine's runs under QEMU (`arch_problems`). `files` (--files /
    IMGBUILD_FILES): a folder consulted before the network for every download, each file it holds checked against
    the lock's sha256 before anything else (not with `sources`, which holds every download already)."""
    logs = log_folder(log_dir)  # first: a state folder that cannot hold the log fails before any other work
    for cache_ref in cache_from or []:
        builders.check_cache_ref(cache_ref, "--cache-from")
    if cache_to:
        builders.check_cache_ref(cache_to, "--cache-to")
    found: dict[str, Path] = {}
    if files is not None and sources is None:
        from imgbuild.build.sources import local_downloads

        say = progress.say if progress is not None else print
        found = local_downloads(files, resolved.content, say=say)  # before any engine work: nothing tagged
    plan = render.plan(resolved, provenance.of(loaded), offline=sources is not None, arch=arch, local_files=found)
    if sources is not None:
        import imgbuild.build.sources as fetched

        index = fetched.check(sources, resolved, plan)  # before any engine work: nothing tagged
    client = engine.connect()
    try:
        if sources is not None:
            fetched.load_bases(client, sources, index, say=progress.say if progress is not None else print)
            fetched.check_debs(client, sources, index.files, plan.apt_packages)  # in the bases just checked
        chosen = builder or builders.select(builder_name)
        cache = builders.cache_plan(chosen, cache_from or [], cache_to)
        check_disk(client, plan)
        check_platform(client, resolved, plan, engine_store=chosen.engine_store)
        if chosen.engine_store:  # other buildx drivers resolve FROM from registries themselves
            engine.ensure_base_images(client, engine_bases(resolved, plan), pull=pull)
        stamp = dt.datetime.now(dt.timezone.utc)
        log_path = logs / f"{plan.recipe}-{stamp:%Y%m%dT%H%M%SZ}.log"  # or -2, -3 ... (engine.create_log)
        refs = [*plan.image_refs, *(extra_tags or [])]
        # No build-time clock in labels: a timestamp would defeat the layer cache on every rebuild (the
        # engine records the image's creation time itself).
        labels = {"io.imgbuild.version": __version__}
        secret = dockercontext.ca_secret(ca_bundle)
        folder = Path(tempfile.mkdtemp(prefix=f"imgbuild-context-{plan.recipe}-"))
        try:
            with dockercontext.temp_secrets({dockerfile.CA_SECRET_ID: secret}) as secrets:
                dockercontext.write(plan, folder)  # only what the Dockerfile copies; the CA bundle is the secret
                if sources is not None:
                    fetched.stage(sources, index, folder)
                if found:
                    from imgbuild.build.sources import stage_files

                    stage_files(found, folder)
                outcome = builders.build(
                    chosen,
                    client,
                    folder,
                    tags=refs,
                    labels=labels,
                    build_args=build_args or {},
                    nocache=nocache,
                    pull=pull,
                    secrets=secrets,
                    cache=cache,
                    log_path=log_path,
                    progress=progress,
                    network="none" if sources is not None else None,
                    platform=platforms.docker_platform(plan.arch),
                )
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        pushed = None
        if cache.push_ref:
            observer = progress.push_observer() if progress is not None else None
            pushed = _push_cache(client, outcome.image_id, cache.push_ref, observer)
    finally:
        client.close()
    return BuildResult(
        recipe=plan.recipe,
        image_id=outcome.image_id,
        refs=tuple(refs),
        log_path=outcome.log_path,
        steps_total=outcome.steps_total,
        steps_run=outcome.steps_run,
        duration_s=outcome.duration_s,
        warnings=resolved.warnings,
        steps_cached=outcome.steps_cached,
        steps=outcome.steps,
        digest=outcome.digest,
        builder=chosen,
        cache=cache.describe(),
        cache_pushed=pushed,
    )


def _push_cache(client: Any, image_id: str, ref: str, observer: Any | None = None) -> str:
    """The inline cache of --cache-to: the image pushed as REF; REF@DIGEST. A failed push is a `PushError` saying
    that the image itself was built."""
    try:
        return f"{ref}@{builders.push_inline_cache(client, image_id, ref, progress=observer)}"
    except PushError as exc:
        raise PushError(
            f"built {image_id}, but pushing its inline cache as --cache-to {ref} failed: {exc.message}", hint=exc.hint
        ) from None
