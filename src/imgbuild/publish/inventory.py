"""The inventory of a built image: what it holds, read from the image itself through one container of it
(engine.containers), for `imgbuild sbom` and the SBOM `imgbuild push --sbom` writes (image.sbom makes the CycloneDX
document from it).

The container runs with no network and without the image's entrypoint (no hook starts): `dpkg-query` lists the
packages, paths.DPKG_SHA256 gives their .debs' checksums as apt knew them at the build, and each of the image's
interpreters (the python pin's, the system's) lists the distributions it sees (importlib.metadata). The image must
carry the lock it is described with (its manifest's lock digest): a lock's hashes are never attached to another
build's files.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imgbuild import probes
from imgbuild.core import paths
from imgbuild.core.errors import ImgbuildError, VerifyError
from imgbuild.engine.client import ENGINE_ERRORS, connect, engine_error, inspect_image
from imgbuild.engine.containers import Containers
from imgbuild.image import sbom as document
from imgbuild.image.identity import Identity
from imgbuild.image.manifest import Manifest
from imgbuild.pin.resolver import Resolved

TIMEOUT_S = 120.0
SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")
_MARK = "### imgbuild-sbom "


@dataclass(frozen=True)
class Sbom:
    """A document and what it describes."""

    text: str
    image: str
    image_id: str
    recipe: str
    warnings: tuple[str, ...] = ()


def inventory_script(pythons: list[str]) -> str:
    """The bash the container runs: each answer after a marker line (`### imgbuild-sbom NAME`)."""
    lines = [
        f"echo '{_MARK}dpkg'",
        "dpkg-query -W -f '${Package}\\t${Version}\\t${Architecture}\\n' 2>/dev/null || true",
        f"if [ -r {paths.DPKG_SHA256} ]; then echo '{_MARK}dpkg-sha256'; cat {paths.DPKG_SHA256}; fi",
        f"echo '{_MARK}python'",
    ]
    program = shlex.quote(probes.text("python_dists.py"))
    for py in dict.fromkeys(pythons):
        q = shlex.quote(py)
        lines.append(f'if p=$(command -v {q}); then "$p" -c {program} {q} 2>/dev/null || true; fi')
    return "\n".join(lines) + "\n"


def sections(output: str) -> dict[str, str]:
    """The inventory script's output, by marker."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in output.splitlines():
        if line.startswith(_MARK):
            current = found.setdefault(line[len(_MARK) :].strip(), [])
        elif current is not None:
            current.append(line)
    return {name: "".join(f"{x}\n" for x in lines) for name, lines in found.items()}


def collect(client: Any, image: str, *, repo_digests: tuple[str, ...] = ()) -> document.Inventory:
    """Ask a container of `image` what it holds (the engine must have the image)."""
    found = inspect_image(client, image)
    if found is None:
        raise VerifyError(f"{image} is not in the engine", hint="build it first (imgbuild build RECIPE)")
    containers = Containers(client)
    try:
        raw = containers.read_image_file(image, paths.MANIFEST_PATH)
        if raw is None:
            raise VerifyError(f"{image} has no {paths.MANIFEST_PATH}: not an image imgbuild built")
        manifest = Manifest.parse(raw, image)
        script = inventory_script([manifest.python, *SYSTEM_PYTHONS])
        rc, out = containers.run_to_end(
            image, ["bash", "-c", script], "sbom", timeout_s=TIMEOUT_S, entrypoint=[], network_disabled=True
        )
    except ImgbuildError:
        raise
    except ENGINE_ERRORS as exc:
        raise engine_error(exc, f"reading the contents of {image}") from exc
    finally:
        containers.remove_all()
    if rc != 0:
        raise VerifyError(f"the inventory of {image} failed (exit {rc}): {out.strip()[-400:]}")
    parts = sections(out)
    return document.Inventory(
        image=image,
        image_id=str(found["Id"]),
        manifest=manifest,
        dpkg=parts.get("dpkg", ""),
        dpkg_sha256=parts.get("dpkg-sha256"),
        python=parts.get("python", ""),
        repo_digests=tuple(dict.fromkeys([*(found.get("RepoDigests") or ()), *repo_digests])),
        labels=dict((found.get("Config") or {}).get("Labels") or {}),
    )


def make(
    resolved: Resolved,
    named: Identity,
    *,
    image: str | None = None,
    repo_digests: tuple[str, ...] = (),
    client: Any | None = None,
) -> Sbom:
    """The SBOM of the image built from `resolved`, a lock (the command's `lock.for_ref`: its hashes are the
    document's), of its content-addressed ref or `image`, validated against CycloneDX's schema. `named`: the image's
    identity as the command read it (identity.of, once): its ref and lock digest, never read again here. Refused when
    the image was built from another lock."""
    ref = image or named.ref()
    own = client is None
    docker_client = connect() if client is None else client
    try:
        inv = collect(docker_client, ref, repo_digests=repo_digests)
    finally:
        if own:
            docker_client.close()
    digest = named.lock_digest
    if inv.manifest.lock_digest != digest:
        raise VerifyError(
            f"{ref} was built from lock {inv.manifest.lock_digest[:12]}, not from {resolved.name}'s lock "
            f"{digest[:12]}: the lock's hashes would describe another build",
            hint=f"imgbuild build {resolved.name}, or name the image of this lock",
        )
    warnings = []
    if inv.dpkg_sha256 is None:
        warnings.append(f"{ref} has no {paths.DPKG_SHA256}: its Debian packages are listed without hashes")
    text = document.document(inv, resolved)
    document.validate(text)
    return Sbom(text, ref, inv.image_id, resolved.name, tuple(warnings))


def write(sbom: Sbom, output: Path) -> Path:
    """Write the document (atomically: a reader sees the old file or the new one); `OutputError` (exit 14) naming
    the path when it cannot be written."""
    from imgbuild.core.outputs import write_file

    write_file(output, sbom.text, what="the SBOM", parents=True)
    return output


def after_push(resolved: Resolved, named: Identity, result: Any, output: Path, *, client: Any | None = None) -> Sbom:
    """The SBOM of the image of `resolved` (the recipe's lock, as the push read it; `named`: the identity the push
    named the image by) just pushed (`result`: publish.PublishResult), naming it by the manifest digests the registry
    gave each tag, written to `output` (for CI to keep beside the push)."""
    digests = tuple(dict.fromkeys(f"{ref.target.rsplit(':', 1)[0]}@{ref.digest}" for ref in result.refs))
    made = make(resolved, named, repo_digests=digests, client=client)
    write(made, output)
    return made
