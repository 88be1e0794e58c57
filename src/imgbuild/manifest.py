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
    components     {name: {version, source, origin, ...the pin's details}}; sshd also has `ports`
    env            the recipe's `env:` (NAME -> value), set by the image's ENV
    image_env      every variable name the image's own ENV instructions set (PATH, LD_LIBRARY_PATH, the
                   components' and the recipe's): what the ranks of a multi-node job need as well
    mpirun         the recipe's `mpirun:` section
    runtime        the recipe's `runtime:` section
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from imgbuild.errors import VerifyError
from imgbuild.paths import MANIFEST_PATH
from imgbuild.recipe import MpiRun, Platform, Runtime
from imgbuild.schema import EnvName, Port

SCHEMA: Literal[1] = 1


class ComponentEntry(BaseModel):
    """One component as the image records it: its pin, plus the details other stages read (typed here)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    version: str | None
    source: str
    origin: str
    prefix: str | None = None  # where it is installed, when not in the system's paths
    venv: str | None = None  # python: the virtual environment pip installs into
    ports: tuple[Port, ...] = ()  # sshd: the ports it listens on

    def as_dict(self) -> dict[str, Any]:
        """The entry as JSON data, with only the keys it was made with (the typed details are optional)."""
        return self.model_dump(mode="json", exclude_unset=True)


class Manifest(BaseModel):
    """/etc/imgbuild/manifest.json, typed. Made by render (`Manifest(...)` with every field) and read by verify."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_: Literal[1] = Field(SCHEMA, alias="schema")
    recipe: str
    recipe_digest: str
    lock_digest: str
    base: str
    platform: Platform
    components: dict[str, ComponentEntry]
    env: dict[EnvName, str] = {}
    image_env: tuple[EnvName, ...] = ()
    mpirun: MpiRun
    runtime: Runtime

    # ---- what the other stages ask

    @property
    def python(self) -> str:
        """The image's Python: the venv's when the python component has one, else python3 on PATH."""
        py = self.components.get("python")
        return f"{py.venv}/bin/python" if py is not None and py.venv else "python3"

    @property
    def ssh_ports(self) -> tuple[int, ...]:
        """The ports sshd listens on (empty: no sshd, no multi-node runs)."""
        sshd = self.components.get("sshd")
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
        """The components as plain JSON data (what the checks read)."""
        return {name: entry.as_dict() for name, entry in self.components.items()}

    # ---- the file

    def as_data(self) -> dict[str, Any]:
        """The manifest as JSON data, as the file holds it."""
        data = self.model_dump(mode="json", by_alias=True)
        data["components"] = self.component_dicts()
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
