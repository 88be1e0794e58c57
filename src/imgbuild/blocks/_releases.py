"""What every release file has in common: each component's releases, as data with sources, in its block's folder
(blocks/<name>/releases.yaml), read as that block's model of them (a ReleaseFile and its Row, with the component's
own fields) through `component_file`.

A release is a row: its version, its date and its downloads' checksums where known, what it bundles or was tested
with, and `source` (where it was read), with `inferred: true` and `why` on a value nobody read in a source. Adding a
release is adding a row: no Python table to edit. A file that does not fit its model is a ResolveError naming the
file, the key and what was expected.

Where the publisher's own artifact is at hand at lock time, imgbuild.pin.artifacts reads it instead (the EFA
installer tarball's package names, the plugin's RELEASENOTES.md, the commit of a tag's archive, checked against the
row's); these rows are the fallback.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Annotated, Literal, Protocol, TypeVar

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from imgbuild.core import datafile
from imgbuild.core.errors import ResolveError

HERE = Path(__file__).parent

Text = datafile.Text
# An ISO date, or a month (or a year) where the day was not recorded.
When = Annotated[str, StringConstraints(strict=True, pattern=r"^\d{4}(-\d{2}(-\d{2})?)?$")]


# An https address: a page upstream (an issue, a pull request, release notes) or a download.
Url = Annotated[str, StringConstraints(strict=True, pattern=r"^https://[^\s/]+/\S+$")]
Level = Literal["refuse", "warn"]


class Bad(BaseModel):
    """Why a release (or a combination of releases) is known to be bad, as upstream says it: `level` refuse where it
    fails (a hang, a build that aborts), warn where upstream calls it a risk; `links` the upstream pages that say so
    (read before the row was written); `good` the nearest release without it, where one is known."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    level: Level
    why: Text
    links: tuple[Url, ...] = Field(min_length=1)
    good: Text | None = None


Fact = datafile.Sourced  # a fact with where it was read (core.datafile)


UNESTABLISHED = "unestablished: "


class Checksum(BaseModel):
    """The sha256 of one download and where it was read (a well-known third party: Spack's package recipe at a
    commit); `sha256: null` with an origin starting "unestablished: " that says why nobody could read one. `imgbuild
    lock` uses it where neither the publisher's own checksum nor the file can be had, and checks a file it downloads
    against it (imgbuild.pin.checksums). Never invented: a wrong one fails every build, a missing one is listed."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None
    origin: Text

    @model_validator(mode="after")
    def _none_says_why(self) -> Checksum:
        if self.sha256 is None and not self.origin.startswith(UNESTABLISHED):
            raise ValueError(f"a download without a sha256 says why, its origin starting {UNESTABLISHED!r}")
        return self


class Row(Fact):
    """One release (or one release series, where a file allows it: its `bad` then marks every release of it), with
    the checksums of its downloads (URL exactly as the block downloads it -> Checksum)."""

    version: Text
    date: When | None = None
    downloads: dict[Url, Checksum] = {}
    bad: Bad | None = None


class TagRow(Row):
    """A release built from GitHub's archive of its tag: the tag and the commit it names."""

    tag: Text
    commit: Annotated[str, Field(pattern=r"^[0-9a-f]{40}$")] | None = None


class TagRead(BaseModel):
    """The commit a GitHub archive of a release tag was made from (git archive writes it into the archive's global
    pax header), read at `imgbuild lock` (imgbuild.pin.artifacts); `read_from` names the archive."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    commit: Annotated[str, Field(pattern=r"^[0-9a-f]{40}$")]
    read_from: Text


class Artifacts(Protocol):
    """What the publishers' own artifacts say, where they were read (`imgbuild lock`: imgbuild.pin.artifacts; a lock's
    own record when its pins are checked): `read(block, version, url)` is that block's model of it (its
    `Block.artifact`), None where it was not read (the release files answer instead)."""

    def read(self, block: str, version: str, url: str | None) -> BaseModel | None: ...


R = TypeVar("R", bound=Row)


def _condition(key: str, value: str) -> str:
    """A `when` entry checked: `<component>` or `<component>.<detail>` -> a PEP 440 specifier (`>=13`, `==1.18.*`)
    or, for a detail, a value it must equal (`sm_70`)."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)?", key):
        raise ValueError(f"when: {key!r}: expected a component's name, or <component>.<detail>")
    if value[:1] in "<>=!~":
        try:
            SpecifierSet(value)
        except InvalidSpecifier:
            raise ValueError(f"when.{key}: {value!r} is not a PEP 440 version specifier (>=13, ==1.18.*)") from None
    elif "." not in key:
        raise ValueError(f"when.{key}: expected a version specifier (>=13, ==1.18.0), got {value!r}")
    return value


class Combination(Bad):
    """A combination of releases known to be bad: every entry of `when` holds (a component's pinned version in a
    specifier, or one of its pin's details equal to a value), and `source` says where it was read."""

    when: dict[str, Text] = Field(min_length=1)
    source: Text

    @model_validator(mode="after")
    def _conditions(self) -> Combination:
        for key, value in self.when.items():
            _condition(key, value)
        return self


class ReleaseFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    component: Text
    about: Text  # what the list was read from (imgbuild outdated says it)
    read_on: When | None  # when the list was last read against it (None: not recorded)
    releases: tuple[Row, ...] = Field(min_length=1)
    known_bad: tuple[Combination, ...] = ()  # combinations with other components known to be bad
    downloads: dict[Url, Checksum] = {}  # the checksums of the block's downloads that no release names (a key)

    @model_validator(mode="after")
    def _combinations_name_the_component(self) -> ReleaseFile:
        for i, combo in enumerate(self.known_bad):
            if self.component not in {key.split(".", 1)[0] for key in combo.when}:
                raise ValueError(f"known_bad.{i}.when: name {self.component} (a file's combinations are its own)")
        return self

    @model_validator(mode="after")
    def _one_row_per_version(self) -> ReleaseFile:
        seen: set[str] = set()
        for i, row in enumerate(self.releases):
            if row.version in seen:
                raise ValueError(f"releases.{i}: version {row.version} is listed twice")
            seen.add(row.version)
        return self


class TagFile(ReleaseFile):
    releases: tuple[TagRow, ...] = Field(min_length=1)


F = TypeVar("F", bound=ReleaseFile)


def load(path: Path, model: type[F]) -> F:
    """Read and check one release file; ResolveError naming the file, the key and what was expected."""
    return datafile.load(path, model, ResolveError, "the release list")


@functools.cache
def component_file(name: str, model: type[F]) -> F:
    """Block `name`'s release file (blocks/<name>/releases.yaml) as its model, read once."""
    return load(HERE / name / "releases.yaml", model)


def tag_file(component: str) -> TagFile:
    return component_file(component, TagFile)


def by_version(rows: tuple[R, ...]) -> dict[str, R]:
    return {r.version: r for r in rows}


def tag_releases(component: str) -> dict[str, TagRow]:
    return by_version(tag_file(component).releases)


def file_name(name: str) -> str:
    """How a release file is named to users: blocks/<component>/releases.yaml (inside imgbuild's package)."""
    return f"blocks/{name}/releases.yaml"


def row_for(rows: tuple[R, ...], version: str) -> list[R]:
    """The rows that speak for release `version`: its own, then its series' (major.minor) where the file has one."""
    series = ".".join(version.split(".")[:2])
    return [r for r in rows if r.version == version] + [r for r in rows if r.version == series != version]


def holds(version: str | None, details: object, key: str, value: str) -> bool:
    """Whether one `when` entry holds for a pin (its version, its details): `<component>` -> the version is in the
    specifier; `<component>.<detail>` -> the detail is in it (a specifier) or equals it. A version that is not PEP
    440 matches no specifier."""
    got = version if "." not in key else getattr(details, key.split(".", 1)[1], None)
    if got is None:
        return False
    if value[:1] not in "<>=!~":
        return str(got) == value
    try:
        return SpecifierSet(value).contains(str(got), prereleases=True)
    except InvalidVersion:
        return False
