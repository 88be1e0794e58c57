"""The image's manifest, /etc/imgbuild/manifest.json: the one contract between render and verify.

render writes it into every image (`Manifest.to_json`); `imgbuild verify` and `verify --nodes` read it back
from the image (`Manifest.parse`) and learn from it everything they check and how they start containers: the
components with their versions and paths, the recipe's environment, the names of the variables the image's
ENV sets, the `mpirun` line (launch.py) and the `runtime` profile (runprofile.py). Nothing is re-rendered.

Schema 1 (every key below; `image_env` was added later and reads as empty from older images):

    schema         1
    recipe         the recipe's name
    recipe_digest  sha256 of the merged recipe
    lock_digest    sha256 of the lock (the image's `lock-<12 hex>` tag)
    base           the base image reference
    platform       the recipe's `platform:` section
    components     {name: {version, source, origin, ...the pin's details}}: each block's pin, its details flat
                   beside the three and read back through the block's own details model
    env            the recipe's `env:` (NAME -> value), set by the image's ENV
    image_env      every variable name the image's own ENV instructions set (PATH, LD_LIBRARY_PATH, the
                   components' and the recipe's): what the ranks of a multi-node job need as well
    mpirun         the recipe's `mpirun:` section
    runtime        the recipe's `runtime:` section
    app            only in an image with the user's layer (`app:`): `distributions` (name -> version of every Python
                   distribution that layer installs, from the lock's requirement sets `app` and `app/source`) and
                   `code_digest` (imgbuild.probes.codetree's digest of the code it copies in, when it has code)
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from imgbuild.blocks import Pin, python_of
from imgbuild.core.errors import VerifyError
from imgbuild.core.fields import EnvName
from imgbuild.core.paths import MANIFEST_PATH
from imgbuild.pin.resolver import read_details
from imgbuild.recipe import MpiRun, Platform, Runtime

SCHEMA: Literal[1] = 1
PIN_KEYS = ("version", "source", "origin")


def entry(pin: Pin) -> dict[str, Any]:
    """A pin as the manifest's file holds it: version, source, origin and its details' set fields, flat."""
    core = {key: getattr(pin, key) for key in PIN_KEYS}
    return {**core, **pin.details.model_dump(mode="json", exclude_none=True)}


def read_entry(name: str, data: Any) -> Any:
    """A flat manifest entry back to component `name`'s pin (its details through its block's model)."""
    if not isinstance(data, dict) or "details" in data:
        return data
    details = read_details(name, {k: v for k, v in data.items() if k not in PIN_KEYS}, f"components.{name}")
    return {**{k: data[k] for k in PIN_KEYS if k in data}, "details": details}


class AppEntry(BaseModel):
    """What the image's user layer installs, for verify: the lock's versions and the code's digest."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    distributions: dict[str, str] = {}
    code_digest: str | None = None


class Manifest(BaseModel):
    """/etc/imgbuild/manifest.json, typed. Made by render (`Manifest(...)` with every field) and read by verify."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_: Literal[1] = Field(SCHEMA, alias="schema")
    recipe: str
    recipe_digest: str
    lock_digest: str
    base: str
    platform: Platform
    arch: Literal["amd64", "arm64"] = "amd64"  # which of platform.arch this image is (its paths are that one's)
    components: dict[str, Pin]
    env: dict[EnvName, str] = {}
    image_env: tuple[EnvName, ...] = ()
    mpirun: MpiRun
    runtime: Runtime
    app: AppEntry | None = None

    @field_validator("components", mode="before")
    @classmethod
    def _pins(cls, value: object) -> object:
        return {name: read_entry(name, data) for name, data in value.items()} if isinstance(value, dict) else value

    # ---- what the other stages ask

    def details(self, name: str) -> Any:
        """Component `name`'s typed details (None when the image lacks it)."""
        pin = self.components.get(name)
        return pin.details if pin is not None else None

    @property
    def python(self) -> str:
        """The image's Python: the venv's when the python component has one, else python3 on PATH."""
        return python_of(self.components)

    @property
    def ssh_ports(self) -> tuple[int, ...]:
        """The ports sshd listens on (empty: no sshd, no multi-node runs)."""
        sshd = self.details("sshd")
        return sshd.ports if sshd is not None else ()

    @property
    def slots(self) -> int:
        """MPI processes per host: one per device on an accelerator platform, else 1 (as train's hostfile)."""
        return self.platform.devices_per_node if self.platform.accelerator != "none" else 1

    @property
    def rank_env(self) -> tuple[str, ...]:
        """The variables every rank needs as the image sets them: the image's ENV names and the recipe's env."""
        return tuple(dict.fromkeys([*self.image_env, *sorted(self.env)]))

    def component_dicts(self) -> dict[str, dict[str, Any]]:
        """The components as the file holds them (flat JSON data)."""
        return {name: entry(pin) for name, pin in self.components.items()}

    # ---- the file

    def as_data(self) -> dict[str, Any]:
        """The manifest as JSON data, as the file holds it."""
        data = self.model_dump(mode="json", by_alias=True)
        data["components"] = self.component_dicts()
        if data["app"] is None:  # the key exists only in images with a user layer
            del data["app"]
        return data

    def to_json(self) -> str:
        """The file's text: sorted keys, two-space indent, a final newline (byte-for-byte stable)."""
        return json.dumps(self.as_data(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def parse(cls, raw: bytes | str, where: str) -> Manifest:
        """Read a manifest's text; a `VerifyError` naming `where`, the key and what was expected otherwise."""
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise VerifyError(f"{where}: {MANIFEST_PATH} is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise VerifyError(f"{where}: {MANIFEST_PATH} is not a JSON object")
        if data.get("schema") != SCHEMA:
            raise VerifyError(
                f"{where}: {MANIFEST_PATH} has schema {data.get('schema')!r}; this imgbuild reads schema {SCHEMA}",
                hint="verify it with the imgbuild that built it, or rebuild the image",
            )
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(top)'}: {err['msg']}" for err in exc.errors()[:5]
            )
            raise VerifyError(f"{where}: {MANIFEST_PATH} is not a valid imgbuild manifest: {problems}") from None
