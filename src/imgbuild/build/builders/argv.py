"""The docker CLI's command line for one build (`command`: an argument list, no shell) and its environment
(`cli_env`)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from imgbuild.build.builders.cacheplan import Cache
from imgbuild.build.builders.choice import Builder

__all__ = ["cli_env", "command"]


def command(
    builder: Builder,
    context_dir: Path,
    *,
    tags: Sequence[str],
    labels: Mapping[str, str],
    build_args: Mapping[str, str],
    nocache: bool,
    pull: bool,
    secrets: Mapping[str, Path],
    cache: Cache,
    iidfile: Path,
    metadata_file: Path | None,
    network: str | None = None,
    platform: str | None = None,
) -> list[str]:
    """The CLI's argument list for one build (no shell: values are never interpreted). `network`: the RUN steps'
    network mode ("none": an offline build); `platform`: the image's OS/architecture (`linux/arm64`: BuildKit runs
    its steps under QEMU on an x86 machine; None: the engine's own)."""
    argv = [builder.cli, *(["buildx", "build"] if builder.kind == "buildx" else ["build"])]
    if builder.kind == "buildx" and builder.name:
        argv += ["--builder", builder.name]
    argv += ["--progress=plain", "--iidfile", str(iidfile)]
    if builder.kind == "buildx" and metadata_file is not None:
        argv += ["--metadata-file", str(metadata_file)]
    if builder.kind == "buildx" and not builder.engine_store:
        argv.append("--load")
    for tag in tags:
        argv += ["-t", tag]
    for key, value in labels.items():
        argv += ["--label", f"{key}={value}"]
    for key, value in build_args.items():
        argv += ["--build-arg", f"{key}={value}"]
    if nocache:
        argv.append("--no-cache")
    if pull:
        argv.append("--pull")
    if network:
        argv += ["--network", network]
    if platform:
        argv += ["--platform", platform]
    for ident, src in secrets.items():
        argv += ["--secret", f"id={ident},src={src}"]
    argv += list(cache.args)
    argv += ["-f", str(context_dir / "Dockerfile"), str(context_dir)]
    return argv


def cli_env(builder: Builder, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The CLI's environment: ours (DOCKER_HOST, DOCKER_CONTEXT, DOCKER_CONFIG ... pass through), with BuildKit on
    for kind buildkit."""
    out = dict(os.environ if env is None else env)
    if builder.kind == "buildkit":
        out["DOCKER_BUILDKIT"] = "1"
    return out
