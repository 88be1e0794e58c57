"""Recipes: YAML files that describe a target image, validated against a strict schema.

A recipe may `extends:` another (a shipped recipe's name, or a path relative to the file). Parents are merged
into children key by key: mappings merge recursively, lists and scalars are replaced, and `null` removes an
inherited key (e.g. `components: {pytorch: null}`). Unknown keys are rejected with a "did you mean"; every error
names the file, the line, the key path and what was expected.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from imgbuild import paths
from imgbuild.errors import RecipeError
from imgbuild.paths import display
from imgbuild.schema import Digest, EnvName, Strict, pin_validator

# --------------------------------------------------------------------------------------------------------------
# The target


class Base(Strict):
    """The image everything is built on.

    `tag: latest` is refused unless `latest_only: true` says the publisher offers nothing else; such a base
    is accepted with a warning, and pinned by `digest` when one is given.
    """

    image: str = Field(pattern=r"^[a-z0-9][a-z0-9._/:-]*$")
    tag: str = Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
    digest: Digest | None = None
    latest_only: bool = False


class OS(Strict):
    """The base image's distribution and the extra packages the recipe wants from it."""

    family: Literal["debian", "ubuntu"]
    version: str = Field(pattern=r"^\d+(\.\d+)?$")
    packages: tuple[str, ...] = ()


class Platform(Strict):
    """The hardware the image is for."""

    accelerator: Literal["none", "nvidia", "gaudi"]
    gpu_arch: Literal["sm_70", "sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100"] | None = None
    instance_types: tuple[str, ...] = ()
    devices_per_node: int = Field(1, ge=1, le=64)


class Cuda(Strict):
    """The CUDA toolkit in the base image (nvidia/cuda devel images)."""

    version: str
    home: str = "/usr/local/cuda"
    _pin = pin_validator("version")


# --------------------------------------------------------------------------------------------------------------
# Components: each block's options model lives in its module (imgbuild.components.<name>).


def _components_model() -> type[Strict]:
    from imgbuild.components import REGISTRY

    fields: dict[str, Any] = {b.name: (b.options | None, None) for b in REGISTRY}
    model: type[Strict] = create_model(  # type: ignore[call-overload]
        "Components",
        __base__=Strict,
        __doc__="The building blocks of an image; a missing (or null) block is not installed.",
        **fields,
    )
    return model


if TYPE_CHECKING:

    class Components(Strict):
        """The building blocks of an image (a field per registered block)."""

        def __getattr__(self, name: str) -> Any: ...

else:
    Components = _components_model()


class Runtime(Strict):
    """How containers of the image are started (`imgbuild run`, `imgbuild verify`)."""

    runtime: Literal["habana", "nvidia"] | None = None
    gpus: Literal["all"] | None = None
    env: dict[EnvName, str] = {}
    cap_add: tuple[str, ...] = ()
    network: Literal["host"] | None = None
    ipc: Literal["host"] | None = None
    efa_devices: bool = False
    shm_size: str | None = Field(None, pattern=r"^\d+[bkmg]?$")
    memlock_unlimited: bool = True


class MpiRun(Strict):
    """The mpirun command line used across nodes."""

    launcher: str = "mpirun"
    mca: dict[str, str] = {}
    exclude_interfaces: tuple[str, ...] = ("lo", "docker0")
    nccl_socket_ifname: str | None = None
    extra_args: tuple[str, ...] = ()


class Recipe(Strict):
    """A whole target. `name` defaults to the file's stem; `abstract` recipes are only parents."""

    name: str = Field(pattern=r"^[a-z0-9_][a-z0-9._-]*$")
    description: str = ""
    abstract: bool = False
    platform: Platform
    base: Base
    os: OS
    cuda: Cuda | None = None
    components: Components = Components()
    env: dict[EnvName, str] = {}
    runtime: Runtime = Runtime()
    mpirun: MpiRun = MpiRun()
    labels: dict[str, str] = {}

    @model_validator(mode="after")
    def _cuda_matches_platform(self) -> Recipe:
        if self.platform.accelerator == "nvidia" and (self.cuda is None or self.platform.gpu_arch is None):
            raise ValueError("an nvidia platform needs `cuda:` and `platform.gpu_arch`")
        return self


# --------------------------------------------------------------------------------------------------------------
# Loading


class LoadedRecipe(BaseModel):
    """A validated recipe with where it came from."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    recipe: Recipe
    path: Path
    chain: tuple[Path, ...]  # the file, then its parents
    merged: dict[str, Any]  # the merged mapping that was validated (for the lock's fingerprint)

    def concrete(self) -> LoadedRecipe:
        """This recipe, or RecipeError when it is abstract (a parent: nothing is built, run or verified from it)."""
        if self.recipe.abstract:
            raise RecipeError(f"{display(self.path)}: '{self.recipe.name}' is abstract (a parent for other recipes)")
        return self

    @property
    def digest(self) -> str:
        """sha256 of the merged recipe in canonical JSON: a parent's change changes the child's too."""
        text = json.dumps(self.merged, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def shipped_names() -> list[str]:
    """Names of the shipped, buildable recipes (files starting with `_` are parents only)."""
    return sorted(p.stem for p in paths.recipes_dir().glob("*.yaml") if not p.name.startswith("_"))


def find(ref: str) -> Path:
    """A shipped recipe's name or a YAML file's path -> the file."""
    candidate = Path(ref)
    if candidate.suffix in (".yaml", ".yml") or "/" in ref:
        if not candidate.is_file():
            raise RecipeError(f"{ref}: no such recipe file")
        return candidate
    shipped = paths.recipes_dir() / f"{ref}.yaml"
    if shipped.is_file():
        return shipped
    names = shipped_names()
    near = difflib.get_close_matches(ref, names, n=1)
    hint = f"did you mean '{near[0]}'?" if near else f"shipped recipes: {', '.join(names)}"
    raise RecipeError(f"no recipe named '{ref}'", hint=hint)


def load(ref: str | Path) -> LoadedRecipe:
    """Load, merge `extends:` parents and validate a recipe."""
    path = find(str(ref))
    chain: list[Path] = []
    docs: list[tuple[Path, dict[str, Any], dict[tuple[str, ...], int]]] = []
    _read_chain(path, chain, docs)
    merged: dict[str, Any] = {}
    for _, doc, _ in reversed(docs):
        merged = _merge(merged, doc)
    # Only some keys are inherited: a child is its own recipe with its own name and is never abstract by default.
    child = docs[0][1]
    merged["name"] = child.get("name", path.stem)
    merged["abstract"] = child.get("abstract", False)
    merged.setdefault("description", "")
    try:
        recipe = Recipe.model_validate(merged)
    except ValidationError as exc:
        raise RecipeError(_format_errors(exc, docs)) from None
    return LoadedRecipe(recipe=recipe, path=path, chain=tuple(chain), merged=merged)


def _read_chain(
    path: Path,
    chain: list[Path],
    docs: list[tuple[Path, dict[str, Any], dict[tuple[str, ...], int]]],
) -> None:
    resolved = path.resolve()
    if resolved in [p.resolve() for p in chain]:
        cycle = " -> ".join(display(p) for p in [*chain, path])
        raise RecipeError(f"{display(chain[-1])}: extends: cycle: {cycle}")
    chain.append(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise RecipeError(f"{display(path)}: cannot read: {exc.strerror}") from None
    try:
        doc = yaml.safe_load(text)
        lines = _line_map(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{display(path)}:{mark.line + 1}" if mark else display(path)
        raise RecipeError(f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise RecipeError(f"{display(path)}: expected a mapping of keys at the top, got {type(doc).__name__}")
    parent = doc.pop("extends", None)
    docs.append((path, doc, lines))
    if parent is None:
        return
    if not isinstance(parent, str):
        raise RecipeError(f"{display(path)}:{lines.get(('extends',), 1)}: extends: expected a recipe name or path")
    if parent.endswith((".yaml", ".yml")) or "/" in parent:
        parent_path = (path.parent / parent) if not Path(parent).is_absolute() else Path(parent)
        if not parent_path.is_file():
            raise RecipeError(f"{display(path)}:{lines.get(('extends',), 1)}: extends: no such file {parent_path}")
    else:
        parent_path = paths.recipes_dir() / f"{parent}.yaml"
        if not parent_path.is_file():
            names = sorted(p.stem for p in paths.recipes_dir().glob("*.yaml"))
            near = difflib.get_close_matches(parent, names, n=1)
            hint = f"did you mean '{near[0]}'?" if near else f"known recipes: {', '.join(names)}"
            raise RecipeError(
                f"{display(path)}:{lines.get(('extends',), 1)}: extends: no recipe named '{parent}'",
                hint=hint,
            )
    _read_chain(parent_path, chain, docs)


def _merge(parent: dict[str, Any], child: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(parent)
    for key, value in child.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


def _line_map(text: str) -> dict[tuple[str, ...], int]:
    """Key path -> 1-based line of that key in the YAML text."""
    out: dict[tuple[str, ...], int] = {}

    def walk(node: yaml.Node, prefix: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                path = (*prefix, str(key.value))
                out[path] = key.start_mark.line + 1
                walk(value, path)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                out[(*prefix, str(i))] = item.start_mark.line + 1
                walk(item, (*prefix, str(i)))

    root = yaml.compose(text)
    if root is not None:
        walk(root, ())
    return out


def _fields_at(loc: tuple[str | int, ...]) -> list[str]:
    """The field names of the schema object at `loc`, to suggest a close match for an unknown key."""
    model: Any = Recipe
    for part in loc:
        fields = getattr(model, "model_fields", None)
        if fields is None or part not in fields:
            return []
        model = _model_of(fields[part].annotation)
    return list(getattr(model, "model_fields", {}))


def _model_of(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) is not None:
        for arg in get_args(annotation):
            found = _model_of(arg)
            if found is not None:
                return found
    return None


def _format_errors(exc: ValidationError, docs: list[tuple[Path, dict[str, Any], dict[tuple[str, ...], int]]]) -> str:
    lines = []
    for err in exc.errors():
        loc = tuple(str(p) for p in err["loc"] if not str(p).startswith("function-"))
        key = ".".join(loc) or "(top level)"
        where = _where(loc, docs)
        if err["type"] == "extra_forbidden":
            near = difflib.get_close_matches(loc[-1], _fields_at(err["loc"][:-1]), n=1)
            allowed = _fields_at(err["loc"][:-1])
            msg = f"unknown key; did you mean '{near[0]}'?" if near else f"unknown key; expected one of {allowed}"
        elif err["type"] == "missing":
            msg = "required key is missing"
        else:
            msg = err["msg"].removeprefix("Value error, ")
            given = err.get("input")
            if not isinstance(given, dict | list) and "got" not in msg:
                msg += f", got {given!r}"
        lines.append(f"{where}: {key}: {msg}")
    return "invalid recipe:\n  " + "\n  ".join(lines)


def _where(loc: tuple[str, ...], docs: list[tuple[Path, dict[str, Any], dict[tuple[str, ...], int]]]) -> str:
    """The file (child first) that sets the longest prefix of `loc`, with the line of that key."""
    for depth in range(len(loc), 0, -1):
        for path, _, lines in docs:
            if loc[:depth] in lines:
                return f"{display(path)}:{lines[loc[:depth]]}"
    return display(docs[0][0])
