"""The software bill of materials of a built image, as a CycloneDX 1.6 JSON document (cyclonedx-python-lib).

A pure function of what the image itself reports (`Inventory`: its manifest, `dpkg-query`'s packages, the
.deb checksums recorded at its apt-get step (paths.DPKG_SHA256), the Python distributions each of its interpreters
sees, its engine id and registry digests) and of the lock it was built from (`Resolved`: pins and content). The
engine side, a container of the image answering those questions, is `publish.inventory.collect`.

What the document lists:

* the image itself (metadata.component, type container): its engine id, the registry digests it was pushed under
  (then a `pkg:oci` purl), its recipe and lock digest;
* every pin of the lock (bom-ref `pin:<name>`, its version, source and origin); the files its block downloads are
  nested under it with the lock's sha256 (or, where nobody could establish one, the reason), and it depends on the
  Debian packages and Python distributions of the image that carry it (a wheel pin's package; a distro pin's
  packages whose name holds the pin's name and whose version starts with the pin's);
* the base images with the digests the lock recorded;
* every Debian/Ubuntu package (`pkg:deb`), with the SHA256 of its .deb as apt's lists gave it for that exact version
  at install time; none for a package apt's lists did not hold (the base brought it, in a version since replaced) or
  that a later layer installed, said so in a property;
* every Python distribution of the image's environments (`pkg:pypi`, per site folder), with the hashes the lock
  records for that name and version: the index's files for it, one of which is the installed one (the lock does
  not say which platform's), so all are listed; none for a distribution the lock does not hold (the
  distribution's own packages, pip), said so.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from imgbuild import __version__
from imgbuild.core import imageref
from imgbuild.core.errors import VerifyError
from imgbuild.core.versions import same_version
from imgbuild.image.manifest import Manifest
from imgbuild.pin.resolver import Resolved

SPEC_VERSION = "1.6"
MEDIA_TYPE = "application/vnd.cyclonedx+json"
PROP = "imgbuild"  # the namespace of this document's own properties (imgbuild:...)
_NAME_NS = uuid.UUID("5b0a1c0e-9f1d-4c7e-8a55-3f0d1e8f2a61")  # the serial number derives from the image id
_PYTHON_NAMES = {"pytorch": ("torch",)}  # a pin whose Python distribution has another name (else details.package)


@dataclass(frozen=True)
class Deb:
    package: str
    version: str
    architecture: str
    sha256: str | None = None
    recorded: bool = False  # in DPKG_SHA256 at all (False: installed after the runtime stage's apt-get, or no file)


@dataclass(frozen=True)
class PythonDist:
    name: str
    version: str
    location: str  # the site folder it sits in
    interpreters: tuple[str, ...]  # the image's interpreters that see it


@dataclass(frozen=True)
class Inventory:
    """What a container of the image reports, as text (each as the image produces it) and the engine's record."""

    image: str  # the reference the SBOM was made for
    image_id: str  # the engine's id (sha256 of the image config)
    manifest: Manifest
    dpkg: str  # dpkg-query -W -f '${Package}\t${Version}\t${Architecture}\n'
    dpkg_sha256: str | None  # the DPKG_SHA256 file; None when the image has none
    python: str  # one JSON object a line: {"interpreter", "distributions": [{"name", "version", "location"}]}
    repo_digests: tuple[str, ...] = ()  # `repo@sha256:...` of the pushed manifests
    labels: dict[str, str] = field(default_factory=dict)


def parse_dpkg(dpkg: str, recorded: str | None) -> list[Deb]:
    """The installed packages (dpkg-query's lines), each with the recorded SHA256 of that exact
    package, version and architecture (`recorded`: the DPKG_SHA256 file's lines, the hash column possibly empty)."""
    hashes: dict[tuple[str, str, str], str | None] = {}
    for line in (recorded or "").splitlines():
        cols = line.split("\t")
        if len(cols) >= 3 and cols[0]:
            sha = cols[3].strip().lower() if len(cols) > 3 else ""
            hashes[(cols[0], cols[1], cols[2])] = sha if re.fullmatch(r"[0-9a-f]{64}", sha) else None
    debs = []
    for line in dpkg.splitlines():
        cols = line.split("\t")
        if len(cols) < 3 or not cols[0] or not cols[1]:
            continue  # a package dpkg knows but has not installed (config-files) has no version
        key = (cols[0], cols[1], cols[2])
        debs.append(Deb(*key, sha256=hashes.get(key), recorded=key in hashes))
    return sorted(set(debs), key=lambda d: (d.package, d.architecture, d.version))


def parse_python(text: str) -> list[PythonDist]:
    """The distributions of every interpreter's JSON line, one per (name, version, site folder)."""
    seen: dict[tuple[str, str, str], list[str]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except ValueError:
            raise VerifyError(f"the image's Python inventory is not JSON: {line[:200]!r}") from None
        interpreter = str(data.get("interpreter", "?"))
        for d in data.get("distributions", []):
            if not d.get("name") or not d.get("version"):
                continue
            key = (str(d["name"]), str(d["version"]), str(d.get("location", "")))
            seen.setdefault(key, [])
            if interpreter not in seen[key]:
                seen[key].append(interpreter)
    return [PythonDist(n, v, loc, tuple(i)) for (n, v, loc), i in sorted(seen.items(), key=lambda kv: kv[0])]


def normalize(name: str) -> str:
    """PEP 503's normalized project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _deb_upstream(version: str) -> str:
    """A Debian version without its epoch: `1:8.9p1-3` -> `8.9p1-3`."""
    return version.split(":", 1)[1] if ":" in version else version


def _carries(pin_name: str, pin_version: str, deb: Deb) -> bool:
    """Whether a distribution package carries a distro pin: its name holds the pin's, its version starts with it."""
    v = _deb_upstream(deb.version)
    starts = v == pin_version or (v.startswith(pin_version) and v[len(pin_version)] in ".-+~")
    return pin_name.replace("_", "-") in deb.package and starts


def _props(**values: object) -> list[Any]:
    from cyclonedx.model import Property

    named = {f"{PROP}:{k.replace('_', '-')}": v for k, v in values.items()}
    return [Property(name=k, value=str(v)) for k, v in named.items() if v not in (None, "")]


def _sha256(*hexes: str) -> list[Any]:
    from cyclonedx.model import HashAlgorithm, HashType

    return [HashType(alg=HashAlgorithm.SHA_256, content=h.removeprefix("sha256:")) for h in hexes]


def document(inv: Inventory, resolved: Resolved, *, timestamp: dt.datetime | None = None) -> str:
    """The CycloneDX 1.6 JSON document of the image `inv` describes, built from the lock `resolved`."""
    from cyclonedx.model import ExternalReference, ExternalReferenceType, XsUri
    from cyclonedx.model.bom import Bom, BomMetaData
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.model.license import LicenseExpression
    from cyclonedx.model.tool import ToolRepository
    from cyclonedx.output.json import JsonV1Dot6
    from packageurl import PackageURL

    manifest, content = inv.manifest, resolved.content
    os_ = resolved.recipe.os
    distro = f"{os_.family}-{os_.version}"

    # -- Python distributions, with the lock's hashes for that name and version
    locked: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
    for reqs in content.python.values() if content is not None else []:
        for req in reqs:
            locked.setdefault(normalize(req.name), []).append((req.version, req.hashes))
    py_components: dict[str, Component] = {}
    py_by_name: dict[str, list[tuple[str, str]]] = {}
    for d in parse_python(inv.python):
        hashes = next((h for v, h in locked.get(normalize(d.name), []) if same_version(v, d.version)), ())
        ref = f"pypi:{normalize(d.name)}@{d.version}:{d.location}"
        note = (
            None
            if not hashes
            else "the lock's sha256 of the file installed"
            if len(hashes) == 1
            else "the lock's sha256 of every file the index offers for this version; the installed one is among them"
        )
        py_components[ref] = Component(
            type=ComponentType.LIBRARY,
            name=d.name,
            version=d.version,
            bom_ref=ref,
            purl=PackageURL(type="pypi", name=normalize(d.name), version=d.version),
            hashes=_sha256(*hashes),
            properties=_props(
                python_location=d.location,
                python_interpreters=" ".join(d.interpreters),
                hashes=note or "none: the lock does not pin this distribution (the OS's packages, pip, the venv's own)",
            ),
        )
        py_by_name.setdefault(normalize(d.name), []).append((d.version, ref))

    # -- Debian / Ubuntu packages
    deb_components: dict[str, Component] = {}
    deb_refs: dict[str, Deb] = {}
    for deb in parse_dpkg(inv.dpkg, inv.dpkg_sha256):
        ref = f"deb:{deb.package}:{deb.architecture}@{deb.version}"
        deb_refs[ref] = deb
        if deb.sha256:
            why = "the .deb's SHA256 in apt's lists for this version, at the image's apt-get step"
        elif inv.dpkg_sha256 is None:
            why = "none: the image has no record of apt's checksums (built before imgbuild kept one)"
        elif deb.recorded:
            why = "none: apt's lists held no such version at the apt-get step (it came with the base image)"
        else:
            why = "none: installed after the runtime stage's apt-get step"
        deb_components[ref] = Component(
            type=ComponentType.LIBRARY,
            name=deb.package,
            version=deb.version,
            bom_ref=ref,
            purl=PackageURL(
                type="deb",
                namespace=os_.family,
                name=deb.package,
                version=deb.version,
                qualifiers={"arch": deb.architecture, "distro": distro},
            ),
            hashes=_sha256(deb.sha256) if deb.sha256 else [],
            properties=_props(sha256=why),
        )

    # -- the lock's downloads, by the block that downloads them
    by_block = _downloads_by_block(resolved)
    downloads = dict(content.downloads) if content is not None else {}

    def file_component(url: str, block: str | None) -> Any:
        d = downloads.get(url)
        return Component(
            type=ComponentType.FILE,
            name=url.rsplit("/", 1)[-1],
            bom_ref=f"download:{url}",
            hashes=_sha256(d.sha256) if d is not None and d.sha256 else [],
            external_references=[ExternalReference(type=ExternalReferenceType.DISTRIBUTION, url=XsUri(url))],
            properties=_props(
                block=block,
                sha256_origin=(d.origin if d is not None else "none: the lock records no checksum of it"),
            ),
        )

    # -- the pins, each with its downloads and the packages that carry it
    pin_components: dict[str, Component] = {}
    links: dict[str, list[str]] = {}
    for name, pin in sorted(manifest.components.items()):
        ref = f"pin:{name}"
        nested = [file_component(url, name) for url in by_block.get(name, [])]
        details = pin.details.model_dump(mode="json")
        pin_components[ref] = Component(
            type=ComponentType.LIBRARY,
            group="imgbuild.pin",
            name=name,
            version=pin.version,
            bom_ref=ref,
            components=nested,
            properties=_props(
                pin_source=pin.source,
                pin_origin=pin.origin,
                pin_details=json.dumps(details, sort_keys=True, separators=(",", ":")) if details else None,
            ),
        )
        wanted = {normalize(n) for n in (details.get("package"), *_PYTHON_NAMES.get(name, ())) if isinstance(n, str)}
        carried = [
            r
            for n in sorted(wanted)
            for v, r in py_by_name.get(n, [])
            if pin.version is None or same_version(v, pin.version)
        ]
        if pin.source == "distro" and pin.version:
            carried += [r for r, deb in deb_refs.items() if _carries(name, pin.version, deb)]
        if carried:
            links[ref] = carried
    attributed = {url for urls in by_block.values() for url in urls}
    loose = [file_component(url, None) for url in sorted(downloads) if url not in attributed]

    # -- base images
    base_components = []
    for ref_name, base in sorted((content.bases if content is not None else {}).items()):
        base_components.append(
            Component(
                type=ComponentType.CONTAINER,
                name=ref_name,
                bom_ref=f"base:{ref_name}",
                hashes=_sha256(base.digest) if base.digest else [],
                properties=_props(manifest_digest=base.digest, digest_origin=base.origin),
            )
        )

    # -- the image
    repo_digests = sorted(set(inv.repo_digests))
    purl = None
    if repo_digests:
        pushed = imageref.parse(repo_digests[0], where="the image's RepoDigests", error=VerifyError)
        purl = PackageURL(
            type="oci",
            name=pushed.name,
            version=pushed.digest,
            qualifiers={"repository_url": pushed.full_repository},
        )
    image_ref = imageref.parse(inv.image, where="the inventory's image", error=VerifyError)
    image = Component(
        type=ComponentType.CONTAINER,
        name=image_ref.repository,
        version=image_ref.tag,
        bom_ref="image",
        purl=purl,
        licenses=[LicenseExpression(resolved.recipe.license)] if resolved.recipe.license else None,
        properties=[
            *_props(
                image_id=inv.image_id,
                recipe=manifest.recipe,
                recipe_digest=manifest.recipe_digest,
                lock_digest=manifest.lock_digest,
                locked_at=resolved.locked_at,
                base=manifest.base,
            ),
            *_props(**{f"repo_digest_{i}": d for i, d in enumerate(repo_digests)}),
        ],
    )

    stamp = timestamp or dt.datetime.now(dt.timezone.utc)
    bom = Bom(
        serial_number=uuid.uuid5(_NAME_NS, f"{inv.image_id} {','.join(repo_digests)} {stamp.isoformat()}"),
        metadata=BomMetaData(
            component=image,
            timestamp=stamp,
            tools=ToolRepository(
                components=[Component(type=ComponentType.APPLICATION, name="imgbuild", version=__version__)]
            ),
        ),
        components=[
            *pin_components.values(),
            *loose,
            *base_components,
            *deb_components.values(),
            *py_components.values(),
        ],
    )
    everything = {**pin_components, **deb_components, **py_components}
    bom.register_dependency(
        image,
        [*pin_components.values(), *base_components, *loose, *deb_components.values(), *py_components.values()],
    )
    for ref, targets in links.items():
        bom.register_dependency(everything[ref], [everything[t] for t in dict.fromkeys(targets)])
    return str(JsonV1Dot6(bom).output_as_string(indent=2)) + "\n"


def _downloads_by_block(resolved: Resolved) -> dict[str, list[str]]:
    """Each pinned block's download URLs (Block.downloads), as render's context gives them."""
    from imgbuild.blocks import REGISTRY, Downloads, context_for

    ctx = context_for(resolved)
    out: dict[str, list[str]] = {}
    for block in REGISTRY:
        pin = resolved.pins.get(block.name)
        if pin is not None and isinstance(block, Downloads):
            urls = list(block.downloads(pin, ctx))
            if urls:
                out[block.name] = urls
    return out


def validate(text: str) -> None:
    """Refuse a document CycloneDX's JSON schema (1.6, strict) refuses: a VerifyError naming the first problem."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    if error is not None:
        raise VerifyError(f"the SBOM does not follow CycloneDX {SPEC_VERSION}'s schema: {error}")


def components_named(text: str, name: str) -> list[dict[str, Any]]:
    """The components of a document (nested ones too) named `name`: for tests and checks."""

    def walk(items: Iterable[dict[str, Any]]) -> Iterable[dict[str, Any]]:
        for c in items:
            yield c
            yield from walk(c.get("components", []))

    return [c for c in walk(json.loads(text).get("components", [])) if c.get("name") == name]
