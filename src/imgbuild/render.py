"""Rendering: a resolved recipe -> a BuildPlan (Dockerfile text, context files, labels, tags).

A pure function of its input: no Docker, no network, no clock, byte-for-byte stable (mappings are sorted).
The Dockerfile needs only the classic builder (no `RUN --mount`, no `COPY --chmod`): file modes travel in
the build context instead.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass
from functools import cache
from typing import Any

import jinja2

from imgbuild import compat, paths
from imgbuild.components import (
    BUILDER_ORDER,
    RUNTIME_ORDER,
    Context,
    Contribution,
    context_for,
    contribute,
    dedupe,
)
from imgbuild.errors import RenderError
from imgbuild.resolver import Resolved, resolved_to_json

CA_DIR = "imgbuild/ca"  # what `--ca-bundle` adds to the context; copied into builder stages only


@dataclass(frozen=True)
class ContextFile:
    """A file the Dockerfile copies, with its mode (the classic builder has no COPY --chmod)."""

    path: str
    content: bytes
    mode: int = 0o644


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

    @property
    def image_refs(self) -> list[str]:
        return [f"{self.repository}:{t}" for t in self.tags]


@cache
def environment() -> jinja2.Environment:
    """The one Jinja environment: StrictUndefined, so a missing variable is an error, not an empty string."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(paths.images_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["shquote"] = shlex.quote
    env.filters["dquote"] = lambda s: json.dumps(str(s))
    env.filters["kvlines"] = lambda mapping, indent: f" \\\n{indent}".join(
        f"{k}={json.dumps(str(v))}" for k, v in sorted(mapping.items())
    )
    return env


def lock_digest(resolved: Resolved) -> str:
    """sha256 of the lock's canonical JSON: the content-addressed tag derives from it."""
    text = json.dumps(resolved_to_json(resolved), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def readable_tag(resolved: Resolved) -> str:
    """A tag a person can read: the versions that matter most for this target."""
    parts = []
    for name, short in (("gaudi", "gaudi"), ("pytorch", "pt"), ("cuda", "cuda"), ("nccl", "nccl"),
                        ("aws_ofi_nccl", "ofi"), ("efa", "efa"), ("openmpi", "ompi")):  # fmt: skip
        v = resolved.version(name)
        if v:
            parts.append(f"{short}{v}")
    return "-".join(parts) or "latest"


def plan(resolved: Resolved) -> BuildPlan:
    """Render the Dockerfile and the context files of a resolved recipe."""
    ctx = context_for(resolved)
    contribs = {name: contribute(name, pin, ctx) for name, pin in resolved.pins.items()}
    digest = lock_digest(resolved)
    labels = _labels(resolved, digest)
    manifest = _manifest(resolved, digest, contribs)
    try:
        files = _files(resolved, ctx, contribs, manifest)
        dockerfile = _dockerfile(resolved, ctx, contribs, labels)
    except jinja2.TemplateError as exc:
        where = f"{exc.filename}:{exc.lineno}" if isinstance(exc, jinja2.TemplateSyntaxError) else "template"
        raise RenderError(f"rendering {resolved.name} failed in {where}: {exc}") from None
    bases = [resolved.base_ref]
    return BuildPlan(
        recipe=resolved.name,
        dockerfile=dockerfile,
        files=tuple(sorted(files, key=lambda f: f.path)),
        labels=labels,
        lock_digest=digest,
        repository=f"imgbuild/{resolved.name}",
        tags=(f"lock-{digest[:12]}", readable_tag(resolved)),
        base_images=tuple(bases),
    )


def _fragment(name: str, macro: str, **kwargs: Any) -> str:
    try:
        module = environment().get_template(f"components/{name}.j2").module
    except jinja2.TemplateNotFound:
        return ""
    fn = getattr(module, macro, None)
    return str(fn(**kwargs)).strip("\n") if fn is not None else ""


def _dockerfile(resolved: Resolved, ctx: Context, contribs: dict[str, Contribution], labels: dict[str, str]) -> str:
    r, pins = resolved.recipe, resolved.pins
    builder = [
        f for name in BUILDER_ORDER if name in pins
        if (f := _fragment(name, "builder", pin=pins[name], ctx=ctx, r=r, pins=pins))
    ]  # fmt: skip
    runtime = [
        f for name in RUNTIME_ORDER if name in pins
        if (f := _fragment(name, "runtime", pin=pins[name], ctx=ctx, r=r, pins=pins))
    ]  # fmt: skip
    runtime_pkgs = set(r.os.packages).union(*(c.runtime_packages for c in contribs.values()))
    # The builder installs only what downloads and compiles need; the runtime stage gets the rest.
    builder_pkgs = {"ca-certificates"}.union(*(c.builder_packages for c in contribs.values()))
    ordered = [contribs[n] for n in RUNTIME_ORDER if n in contribs]
    env_paths = {
        "PATH": dedupe([p for c in ordered for p in c.path]),
        "LD_LIBRARY_PATH": dedupe([p for c in ordered for p in c.ld_library_path]),
    }
    component_env = {k: v for c in ordered for k, v in c.env.items()}
    recipe_env = dict(sorted({**component_env, **r.env}.items()))
    return (
        environment()
        .get_template("Dockerfile.j2")
        .render(
            resolved=resolved,
            r=r,
            ctx=ctx,
            builder=builder,
            runtime=runtime,
            builder_packages=sorted(builder_pkgs),
            runtime_packages=sorted(runtime_pkgs),
            env_paths=env_paths,
            env=recipe_env,
            labels=dict(sorted(labels.items())),
            ca_dir=CA_DIR,
            has_sshd="sshd" in pins,
            has_sagemaker="sagemaker" in pins,
        )
    )


def _labels(resolved: Resolved, digest: str) -> dict[str, str]:
    r = resolved.recipe
    labels = {
        "org.opencontainers.image.title": f"imgbuild/{r.name}",
        "org.opencontainers.image.description": r.description,
        "org.opencontainers.image.base.name": resolved.base_ref,
        "org.opencontainers.image.version": readable_tag(resolved),
        "io.imgbuild.recipe": r.name,
        "io.imgbuild.lock-digest": digest,
    }
    for name, pin in resolved.pins.items():
        if pin.version and name != "base":
            labels[f"io.imgbuild.component.{name}"] = pin.version
    labels.update(r.labels)
    return labels


def _manifest(resolved: Resolved, digest: str, contribs: dict[str, Contribution]) -> dict[str, Any]:
    r = resolved.recipe
    return {
        "schema": 1,
        "recipe": r.name,
        "recipe_digest": resolved.recipe_digest,
        "lock_digest": digest,
        "base": resolved.base_ref,
        "platform": r.platform.model_dump(mode="json"),
        "components": {n: contribs[n].manifest for n in sorted(contribs) if n != "base"},
        "env": dict(sorted(r.env.items())),
        "mpirun": r.mpirun.model_dump(mode="json"),
        "runtime": r.runtime.model_dump(mode="json"),
    }


def _files(
    resolved: Resolved, ctx: Context, contribs: dict[str, Contribution], manifest: dict[str, Any]
) -> list[ContextFile]:
    r, pins = resolved.recipe, resolved.pins
    files = [
        ContextFile("imgbuild/manifest.json", (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()),
        ContextFile(
            f"{CA_DIR}/README",
            b"Extra CA certificates (*.crt) for downloads during the build (imgbuild build --ca-bundle).\n"
            b"Copied into builder stages only: the final image never contains them.\n",
        ),
    ]
    env = environment()
    if "sshd" in pins:
        assert r.components.sshd is not None
        sm = r.components.sagemaker
        vars_ = {"sshd": r.components.sshd, "sagemaker": sm, "r": r}
        files.append(
            ContextFile("imgbuild/sshd_config", env.get_template("files/sshd_config.j2").render(**vars_).encode())
        )
        files.append(
            ContextFile("imgbuild/ssh_config", env.get_template("files/ssh_config.j2").render(**vars_).encode())
        )
    files.append(
        ContextFile(
            "imgbuild/entrypoint.sh",
            env.get_template("files/entrypoint.sh.j2").render(r=r, ctx=ctx, pins=pins).encode(),
            0o755,
        )
    )
    if "sagemaker" in pins:
        files.append(
            ContextFile(
                "imgbuild/train",
                env.get_template("files/train.j2").render(r=r, ctx=ctx, pins=pins).encode(),
                0o755,
            )
        )
    return files


def efa_flags(resolved: Resolved) -> str:
    """The EFA installer's command line inside a container build."""
    e = resolved.recipe.components.efa
    assert e is not None
    flags = [*compat.EFA_CONTAINER_FLAGS, f"--mpi={e.mpi}"]
    if e.minimal:
        flags.append("--minimal")
    plugin = resolved.pins.get("aws_ofi_nccl")
    if plugin is not None and plugin.source == "efa" and compat.Version(e.version) >= compat.Version("1.48.0"):
        flags.append("--disable-ngc")  # 1.48+ skips the NCCL plugin on bases it takes for NGC images
    return " ".join(flags)


environment().globals["efa_flags"] = efa_flags
