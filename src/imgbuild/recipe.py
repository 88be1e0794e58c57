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
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args, get_origin

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    model_validator,
)

from imgbuild.blocks.app import App  # the user's layer (`app:`): the options of the block of that name
from imgbuild.blocks.cuda import Cuda  # the target's CUDA toolkit (`cuda:`): the options of the block of that name
from imgbuild.core import files, imageref, paths
from imgbuild.core.errors import RecipeError
from imgbuild.core.paths import display
from imgbuild.spec.schema import (
    Capability,
    Command,
    DebPackage,
    Digest,
    EnvName,
    InstanceType,
    Interface,
    LabelKey,
    McaName,
    NcclInterfaces,
    Strict,
    Text,
    matching,
    one_line,
)

# --------------------------------------------------------------------------------------------------------------
# The target

ImageTag = Annotated[
    str,
    AfterValidator(matching(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}", "a tag of letters, digits and . _ - (128 at most)")),
]


def _image_name(value: str) -> str:
    """base.image: an image reference's name (core/imageref's grammar), the tag and digest being keys of their own."""
    expected = "an image name such as debian, nvidia/cuda or host:5000/team/image, without :TAG or @DIGEST"
    try:
        ref = imageref.parse(value)
    except ValueError:
        raise ValueError(f"expected {expected}, got {value!r}") from None
    if ref.tag or ref.digest:
        raise ValueError(f"expected {expected} (base.tag and base.digest hold those), got {value!r}")
    return value


class Base(Strict):
    """The image everything is built on.

    `tag: latest` is refused unless `latest_only: true` says the publisher offers nothing else; such a base
    is accepted with a warning, and pinned by `digest` when one is given. `builder_tag` gives the builder stage
    another tag of the same image (nvidia/cuda: compile on `-devel`, ship `-runtime`, several GB smaller).
    """

    image: Annotated[str, AfterValidator(_image_name)]
    """The base image's name (debian, nvidia/cuda, host:5000/team/image), without its tag or digest."""
    tag: ImageTag
    """The base image's tag (bookworm-slim, 12.8.1-cudnn-devel-ubuntu22.04); `latest` only with `latest_only`."""
    builder_tag: ImageTag | None = None
    """Another tag of the same image for the builder stage (nvidia/cuda: compile on `-devel`, ship `-runtime`)."""
    digest: Digest | None = None
    """Pins the base: `FROM image@digest`."""
    latest_only: bool = False
    """The publisher offers no tag but `latest`: such a base is accepted with a warning (pin it with `digest`)."""


class OS(Strict):
    """The base image's distribution and the extra packages the recipe wants from it."""

    family: Literal["debian", "ubuntu"]
    """The base image's distribution."""
    version: Annotated[str, AfterValidator(matching(r"\d+(\.\d+)?", "a release number such as 12 or 22.04"))]
    """Its release (12, 22.04)."""
    packages: tuple[DebPackage, ...] = ()
    """Extra Debian packages for the image (`name` or `name=VERSION`)."""


Arch = Literal["amd64", "arm64"]


def _arch_list(value: object) -> object:
    """`arch: arm64` or `arch: [amd64, arm64]`: one architecture or several, none twice."""
    items = [value] if isinstance(value, str) else value
    if isinstance(items, (list, tuple)):
        if not items:
            raise ValueError("expected an architecture or a list of them (amd64, arm64), got an empty list")
        unknown = [item for item in items if item not in ("amd64", "arm64")]
        if unknown:
            raise ValueError(f"expected amd64 or arm64 (Docker's names; a list for several), got {unknown[0]!r}")
        if len(set(items)) != len(items):
            raise ValueError(f"an architecture is listed twice: {list(items)}")
        return tuple(items)
    return value


class Platform(Strict):
    """The hardware the image is for."""

    accelerator: Literal["none", "nvidia", "gaudi"]
    """The devices the image drives: none (CPU), nvidia (then `cuda:` and `gpu_arch`) or gaudi."""
    arch: Annotated[
        tuple[Literal["amd64", "arm64"], ...],
        BeforeValidator(_arch_list, json_schema_input_type=Arch | list[Arch]),  # `imgbuild schema`: one or a list
    ] = ("amd64",)
    """The CPU architectures the image is built for (Docker's names): one, or a list for a multi-architecture image (the
    first is the default `imgbuild build` makes; `--platform` picks another). AWS's Graviton and Grace instances
    (p6e-gb200) are arm64."""
    gpu_arch: Literal["sm_70", "sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_103"] | None = None
    """nvidia: the GPU architecture the compiled parts are built for: sm_70 (V100) ... sm_90 (H100), sm_100 (B200),
    sm_103 (B300: CUDA >= 12.9)."""
    instance_types: tuple[InstanceType, ...] = ()
    """The EC2 instance types the image is for: their EFA devices (`imgbuild run --print`), environment (multi-node
    NVLink) and published NCCL figures (the nccl-tests verdict)."""
    devices_per_node: int = Field(1, ge=1, le=64)
    """Accelerators per host: the MPI slots per host of a multi-node run."""


# --------------------------------------------------------------------------------------------------------------
# Components: each block's options model lives in its module (imgbuild.blocks.<name>).


def _components_model() -> type[Strict]:
    from imgbuild.blocks import REGISTRY

    fields: dict[str, Any] = {b.name: (b.options | None, None) for b in REGISTRY if not b.top_level}
    model: type[Strict] = create_model(
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
    """The container runtime (`--runtime`)."""
    gpus: Literal["all"] | None = None
    """`--gpus all`, where the host has a GPU and NVIDIA's container toolkit."""
    env: dict[EnvName, Text] = {}
    """Variables set in the container (`-e`)."""
    cap_add: tuple[Capability, ...] = ()
    """Linux capabilities added (`--cap-add`)."""
    network: Literal["host"] | None = None
    """`--net=host`: the host's network (multi-node traffic, EFA)."""
    ipc: Literal["host"] | None = None
    """`--ipc=host`: the host's shared memory (no `shm_size` then)."""
    efa_devices: bool = False
    """Pass each EFA device the host has (/dev/infiniband/uverbsN)."""
    host_devices: tuple[Annotated[str, AfterValidator(matching(r"/dev/[A-Za-z0-9._/-]+", "a /dev path"))], ...] = ()
    """Device nodes passed only where the host has them (`imgbuild run`, verify); blocks add theirs (gdrcopy:
    /dev/gdrdrv) to the image manifest's copy of this section."""
    shm_size: (
        Annotated[str, AfterValidator(matching(r"\d+[bkmg]?", "a size such as 1g, 512m or 1073741824"))] | None
    ) = None
    """The size of /dev/shm (`--shm-size`; 1g when not set), unless `ipc: host`."""
    memlock_unlimited: bool = True
    """`--ulimit memlock=-1:-1`: EFA and NCCL pin memory."""


class MpiRun(Strict):
    """The mpirun command line used across nodes (launch.py builds it; `train` reads it from mpirun.args, one
    argument per line)."""

    launcher: Command = "mpirun"
    """The mpirun command: a name on PATH or its absolute path."""
    mca: dict[McaName, Text] = {}
    """MCA parameters: `--mca KEY VALUE` each, sorted by key."""
    exclude_interfaces: tuple[Interface, ...] = ("lo", "docker0")
    """Interfaces Open MPI's TCP transport and out-of-band channel leave out (`btl_tcp_if_exclude`,
    `oob_tcp_if_exclude`, unless `mca` sets them)."""
    nccl_socket_ifname: NcclInterfaces | None = None
    """The default of NCCL_SOCKET_IFNAME in the launcher's environment (a value the job sets wins): interface prefixes,
    `^` to exclude, `=` for an exact name."""
    extra_args: tuple[Text, ...] = ()
    """Arguments right after the launcher (`--allow-run-as-root`)."""


HoldName = Annotated[
    str, AfterValidator(matching(r"[a-z0-9_]+", "a component of `imgbuild outdated` (pytorch, numpy)"))
]
HoldReason = Annotated[str, Field(min_length=1), AfterValidator(one_line)]


class Recipe(Strict):
    """A whole target. `name` defaults to the file's stem; `abstract` recipes are only parents."""

    name: Annotated[
        str, AfterValidator(matching(r"[a-z0-9_][a-z0-9._-]*", "a name of lowercase letters, digits and . _ -"))
    ]
    """The recipe's name (default: the file's name without .yaml); never inherited."""
    description: Text = ""
    """One line about the image (`imgbuild list`)."""
    abstract: bool = False
    """Only a parent for other recipes: nothing is built, run or verified from it; never inherited."""
    platform: Platform
    base: Base
    os: OS
    cuda: Cuda | None = None
    components: Components = Components()
    env: dict[EnvName, Text] = {}
    """Variables the image sets (Dockerfile `ENV`; `FI_*`, `NCCL_*`, `HCCL_*` ...), after the blocks' own."""
    runtime: Runtime = Runtime()
    mpirun: MpiRun = MpiRun()
    labels: dict[LabelKey, Text] = {}
    """Image labels (Dockerfile `LABEL`), besides imgbuild's own."""
    license: Text | None = None
    """An SPDX expression: the image's org.opencontainers.image.licenses label."""
    app: App | None = None
    hold: dict[HoldName, HoldReason] = {}
    """Components kept behind their newest release on purpose, each with the reason (`imgbuild outdated` shows them as
    held, not behind; `lock --upgrade` leaves them unless named): a row of `imgbuild outdated` -> why."""

    @model_validator(mode="after")
    def _cuda_matches_platform(self) -> Recipe:
        if self.platform.accelerator == "nvidia" and (self.cuda is None or self.platform.gpu_arch is None):
            raise ValueError("an nvidia platform needs `cuda:` and `platform.gpu_arch`")
        return self


# --------------------------------------------------------------------------------------------------------------
# Loading


class LoadedRecipe(BaseModel):
    """A validated recipe with where it came from."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True, defer_build=True)

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
        """sha256 of the merged recipe in canonical JSON: a parent's change changes the child's too. `hold` is left
        out: why a pin stays behind changes nothing the lock or the image holds, so it never makes a lock stale."""
        image = {key: value for key, value in self.merged.items() if key != "hold"}
        text = json.dumps(image, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def shipped_names() -> list[str]:
    """Names of the shipped, buildable recipes (files starting with `_` are parents only)."""
    return sorted(p.stem for p in paths.recipes_dir().glob("*.yaml") if not p.name.startswith("_"))


def find(ref: str) -> Path:
    """A shipped recipe's name or a YAML file's path -> the file."""
    candidate = Path(ref)
    if candidate.suffix in (".yaml", ".yml") or "/" in ref:
        if not _is_file(candidate, shown(ref)):
            raise RecipeError(f"{shown(ref)}: no such recipe file")
        return candidate
    shipped = paths.recipes_dir() / f"{ref}.yaml"
    if _is_file(shipped, f"recipe {_cut(ref)!r}"):
        return shipped
    names = shipped_names()
    near = difflib.get_close_matches(ref, names, n=1)
    hint = f"did you mean '{near[0]}'?" if near else f"shipped recipes: {', '.join(names)}"
    raise RecipeError(f"no recipe named {_cut(ref)!r}", hint=hint)


def _is_file(path: Path, label: str) -> bool:
    """Path.is_file, with the errors it does not swallow (a name longer than the system takes, ENAMETOOLONG) as a
    RecipeError starting with `label`."""
    try:
        return path.is_file()
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the name
        raise RecipeError(f"{label}: not a usable file name: {getattr(exc, 'strerror', None) or exc}") from None


def load(ref: str | Path) -> LoadedRecipe:
    """Load, merge `extends:` parents and validate a recipe."""
    path = find(str(ref))
    chain: list[Path] = []
    docs: list[tuple[Path, dict[str, Any], dict[tuple[str, ...], int]]] = []
    _read_chain(path, chain, docs, display(path))
    for doc_path, doc, lines in docs:
        _read_requirements_file(doc_path, doc, lines)
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
    _keep_block_rules(recipe, docs)
    if recipe.app is not None and recipe.app.code is not None:
        _place_code(recipe.app.code, docs)
    return LoadedRecipe(recipe=recipe, path=path, chain=tuple(chain), merged=merged)


def _keep_block_rules(recipe: Recipe, docs: list[tuple[Path, dict[str, Any], dict[tuple[str, ...], int]]]) -> None:
    """Each block's rule with the rest of the recipe (`Block.recipe_rule`), for every command that loads it: a
    RecipeError naming the file and line that set the key a rule names."""
    from imgbuild.blocks import REGISTRY

    broken = [found for block in REGISTRY if (found := block.recipe_rule(recipe)) is not None]
    if broken:
        raise RecipeError(
            "invalid recipe:\n  " + "\n  ".join(f"{_where(loc, docs)}: {'.'.join(loc)}: {why}" for loc, why in broken)
        )


def _inside(doc_path: Path, name: str, key: str) -> Path:
    """`name` (relative) resolved against the folder of the recipe `doc_path`, which it must not leave (links
    resolved): a recipe names files beside it, never elsewhere on the machine that builds it."""
    try:
        return files.inside(doc_path.parent, doc_path.parent / name)
    except files.Outside as exc:
        raise RecipeError(
            f"{key}: {name!r} is outside the recipe's folder {display(exc.folder)} (it resolves to "
            f"{display(exc.target)})",
            hint="move it beside the recipe (or the recipe beside it)",
        ) from None
    except files.Refused as exc:  # a link loop, a name the system refuses
        raise RecipeError(f"{key}: {exc}") from None


def _read_requirements_file(doc_path: Path, doc: dict[str, Any], lines: dict[tuple[str, ...], int]) -> None:
    """`app.requirements: FILE` -> the file's requirements (and `requirements_file: FILE`): the file (beside the
    recipe) read now, so its requirements are part
    of the merged recipe and of its digest (an edited file makes the lock stale). Errors name the file and its line."""
    app = doc.get("app")
    if isinstance(app, dict) and "requirements_file" in app:
        line = lines.get(("app", "requirements_file"), 1)
        raise RecipeError(
            f"{display(doc_path)}:{line}: app.requirements_file: set by imgbuild: write `requirements: FILE` instead"
        )
    if not isinstance(app, dict) or not isinstance(app.get("requirements"), str):
        return
    from imgbuild.blocks.app import parse_requirements

    name = app["requirements"]
    key = f"{display(doc_path)}:{lines.get(('app', 'requirements'), 1)}: app.requirements"
    if not name.endswith(".txt") or not name.isprintable():
        raise RecipeError(
            f"{key}: expected a list of requirements or a requirements file's name (*.txt), got {_cut(name)!r}"
        )
    target = _inside(doc_path, name, key)
    if not target.exists():
        raise RecipeError(f"{key}: no such file {display(target)}")
    try:
        text = files.read_text_bounded(target, MAX_BYTES)
    except files.Refused as exc:
        raise RecipeError(f"{key}: cannot read it: {exc}") from None
    try:
        parsed = parse_requirements(text, display(target))
    except ValueError as exc:
        raise RecipeError(f"{key}: {exc}") from None
    app["requirements"], app["requirements_file"] = parsed, name


def _place_code(code: Any, docs: list[tuple[Path, dict[str, Any], dict[tuple[str, ...], int]]]) -> None:
    """app.code.dir is relative to the recipe that names it (the child's, else a parent's): tell the model which
    folder that is, after checking the code folder is there and inside it."""
    for doc_path, doc, lines in docs:
        app = doc.get("app")
        if isinstance(app, dict) and isinstance(app.get("code"), dict) and "dir" in app["code"]:
            key = f"{display(doc_path)}:{lines.get(('app', 'code', 'dir'), 1)}: app.code.dir"
            target = _inside(doc_path, code.dir, key)
            if not target.is_dir():
                raise RecipeError(f"{key}: no such folder {display(target)}")
            home = Path.home().resolve()
            if target == Path(target.anchor) or home.is_relative_to(target):
                raise RecipeError(
                    f"{key}: {code.dir!r} is {display(target)}, which holds your home folder: name the folder of "
                    "your code alone",
                    hint="put the recipe beside the code folder, and name that folder (code: {dir: src})",
                )
            code._root = doc_path.parent
            return


# A recipe is a few kilobytes: a bigger file is refused before it is parsed.
MAX_BYTES = 1 << 20
# Recipes nest a few levels (components.sshd.ports); deeper documents are refused while they are parsed, far
# below Python's recursion limit.
MAX_DEPTH = 32
_RECIPE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")


def _cut(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def shown(text: object, limit: int = 80) -> str:
    """Text from a recipe as an error message may carry it: as it is when it is one printable line, else its
    repr (no raw newline or control character from a file ever reaches the terminal); long text is cut.
    Values are shown as `{_cut(value)!r}`, which escapes the same way."""
    s = _cut(str(text), limit)
    return s if s.isprintable() else repr(s)


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader without what recipes never need and what makes loading unbounded.

    - Anchors and aliases (`&name`, `*name`) are refused: a few hundred bytes of nested aliases (a "billion
      laughs" document) expand to gigabytes wherever the document is walked. Recipes share settings with
      `extends:` instead.
    - Nesting deeper than MAX_DEPTH is refused.
    - Tags that construct values a recipe cannot hold (!!binary, !!set, !!omap, !!pairs) are errors, and an
      unquoted date stays the text it is (`2024-01-01`), so the merged recipe is plain JSON data.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event = self.peek_event()
        if getattr(event, "anchor", None) is not None:
            what = "an alias" if isinstance(event, yaml.AliasEvent) else "an anchor"
            raise yaml.composer.ComposerError(
                None,
                None,
                f"found {what} ({'*' if what == 'an alias' else '&'}{shown(event.anchor)}): anchors and aliases "
                "are not allowed in recipes (share settings with `extends:`)",
                event.start_mark,
            )
        if self._depth >= MAX_DEPTH:
            raise yaml.composer.ComposerError(
                None, None, f"nested deeper than {MAX_DEPTH} levels: not a recipe", event.start_mark
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _as_text(loader: yaml.BaseLoader, node: yaml.Node) -> str:
    return str(node.value)


def _recipe_values(loader: type[yaml.constructor.SafeConstructor]) -> None:
    """The constructors recipes get (both loaders): an unquoted date is text, and no tag builds bytes or sets."""
    loader.add_constructor("tag:yaml.org,2002:timestamp", _as_text)
    for tag in ("binary", "set", "omap", "pairs"):
        loader.yaml_constructors.pop(f"tag:yaml.org,2002:{tag}", None)


_recipe_values(_Loader)


# libyaml's parser, where PyYAML was built with it (its wheels are), reads a recipe several times faster than
# _Loader (about 3 ms instead of 20 for the shipped recipes, a part of every command's start-up). Its composer
# runs in C and cannot be guarded like _Loader's: a document is first read as events (no recursion, no aliases
# followed) and composed in C only when it has no anchor or alias and nests at most MAX_DEPTH levels.
def _libyaml_loader() -> type[yaml.CSafeLoader] | None:
    if not getattr(yaml, "__with_libyaml__", False):
        return None

    class CLoader(yaml.CSafeLoader):
        """libyaml's safe loader with the recipe constructors."""

    _recipe_values(CLoader)
    return CLoader


_CLoader = _libyaml_loader()


def _plain(text: str) -> bool:
    """Whether `text` parses (by libyaml) into events with no anchor or alias and no node deeper than MAX_DEPTH."""
    assert _CLoader is not None
    loader = _CLoader(text)
    depth = 0
    try:
        while loader.check_event():
            event = loader.get_event()
            if isinstance(event, yaml.NodeEvent) and (event.anchor is not None or depth >= MAX_DEPTH):
                return False
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    finally:
        loader.dispose()
    return True


def _read(loader_class: type[yaml.SafeLoader] | type[yaml.CSafeLoader], text: str) -> tuple[yaml.Node | None, Any]:
    """`text`'s root node (for the line of each key) and its value, as `loader_class` reads them."""
    loader = loader_class(text)
    try:
        node = loader.get_single_node()
        return node, loader.construct_document(node) if node is not None else None
    finally:
        loader.dispose()


def _compose(text: str) -> tuple[yaml.Node | None, Any]:
    """A document's root node (for the line of each key) and its value."""
    if _CLoader is not None:
        try:
            if _plain(text):
                return _read(_CLoader, text)
        except yaml.YAMLError:
            pass  # not thrown away: _Loader reads the document again just below and reports what is wrong
    # Anything libyaml refused, or would not be given, is read by _Loader: its errors (and their lines and
    # wording, which byte offsets from libyaml would not give) are the ones recipes have always had. Its reader
    # refuses control characters at once.
    return _read(_Loader, text)


def _parse(path: Path, label: str) -> tuple[dict[str, Any], dict[tuple[str, ...], int]]:
    """A recipe file's top-level mapping and the line of each key path. Errors start with `label`: the file's
    name, or for a parent, the child's `extends:` key and the parent's name."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise RecipeError(f"{label}: cannot read: {exc.strerror}") from None
    if len(data) > MAX_BYTES:
        raise RecipeError(f"{label}: larger than {MAX_BYTES >> 10} KiB: not a recipe")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise RecipeError(
            f"{label}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}): recipes must be UTF-8 encoded",
            hint=f"convert it, e.g. iconv -f latin1 -t utf-8 {shlex.quote(str(path))}",
        ) from None
    try:
        node, doc = _compose(text)
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        raise RecipeError(
            f"{label}:{line}: not valid YAML: character U+{exc.character:04X} is not allowed in YAML"
        ) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{label}:{mark.line + 1}" if mark is not None else label
        raise RecipeError(f"{where}: not valid YAML: {shown(exc.problem or exc.context, 200)}") from None
    except yaml.YAMLError as exc:
        raise RecipeError(f"{label}: not valid YAML: {shown(exc, 200)}") from None
    except ValueError as exc:  # a value Python will not convert: an integer past its 4300-digit limit
        raise RecipeError(f"{label}: not a recipe value: {shown(str(exc).split(';')[0], 200)}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        kind = "a list" if isinstance(doc, list) else "a single value"
        raise RecipeError(f"{label}: expected a mapping of keys at the top (a recipe), got {kind}")
    return doc, _line_map(node)


# How many recipes one `extends:` chain may hold, the recipe itself included. The shipped chains are 3 deep at most
# (a child of a100 -> a100 -> _cuda); a chain longer than this is a generated or runaway one, refused with this limit
# named rather than walked (each link opens and parses a file).
MAX_CHAIN = 64


def _read_chain(
    path: Path,
    chain: list[Path],
    docs: list[tuple[Path, dict[str, Any], dict[tuple[str, ...], int]]],
    label: str,
) -> None:
    """Read `path` and each parent its `extends:` names, child first, into `chain` (the paths) and `docs` (each
    document without its `extends:` key, and its lines). A loop: no recursion, whatever the chain's length; a cycle or
    a chain of more than MAX_CHAIN recipes is a RecipeError naming the file that extends once too far."""
    seen: set[Path] = set()
    while True:
        resolved = path.resolve()
        if resolved in seen:
            cycle = " -> ".join(display(p) for p in [*chain, path])
            raise RecipeError(f"{display(chain[-1])}: extends: cycle: {cycle}")
        if len(chain) >= MAX_CHAIN:
            raise RecipeError(
                f"{label}: the extends: chain from {display(chain[0])} is longer than {MAX_CHAIN} recipes",
                hint=f"a recipe extends at most {MAX_CHAIN - 1} others in a row: merge some of them",
            )
        seen.add(resolved)
        chain.append(path)
        doc, lines = _parse(path, label)
        parent = doc.pop("extends", None)
        docs.append((path, doc, lines))
        if parent is None:
            return
        key = f"{display(path)}:{lines.get(('extends',), 1)}: extends"
        path = _parent(path, parent, key)
        label = f"{key}: {display(path)}"


def _parent(path: Path, parent: object, key: str) -> Path:
    """The file an `extends:` value names: a shipped recipe's name, or a .yaml/.yml path relative to the recipe.
    Nothing else is opened, so an error never shows another kind of file's content."""
    expected = "a shipped recipe's name or the path of a .yaml/.yml file"
    if not isinstance(parent, str):
        raise RecipeError(f"{key}: expected {expected}, got {type(parent).__name__}")
    if parent.endswith((".yaml", ".yml")):
        parent_path = path.parent / parent  # an absolute path stays itself
        if not _is_file(parent_path, key):
            raise RecipeError(f"{key}: no such file {shown(parent_path)}")
        return parent_path
    if "/" in parent or not _RECIPE_NAME.fullmatch(parent):
        raise RecipeError(f"{key}: expected {expected}, got {_cut(parent)!r}")
    parent_path = paths.recipes_dir() / f"{parent}.yaml"
    if not parent_path.is_file():
        names = sorted(p.stem for p in paths.recipes_dir().glob("*.yaml"))
        near = difflib.get_close_matches(parent, names, n=1)
        hint = f"did you mean '{near[0]}'?" if near else f"known recipes: {', '.join(names)}"
        raise RecipeError(f"{key}: no recipe named {parent!r}", hint=hint)
    return parent_path


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


def _line_map(root: yaml.Node | None) -> dict[tuple[str, ...], int]:
    """Key path -> 1-based line of that key in the YAML document."""
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
        key = ".".join(shown(part) for part in loc) or "(top level)"
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
                msg += f", got {_cut(given) if isinstance(given, str) else given!r}"
        lines.append(f"{where}: {key}: {msg}")
    return "invalid recipe:\n  " + "\n  ".join(lines)


def where_set(loaded: LoadedRecipe, *loc: str) -> tuple[Path, str]:
    """The recipe file (the recipe itself first, then its parents) that sets key `loc`, and 'file:line' of that key:
    for an error about a merged value, naming the file where it is written (read again: errors only)."""
    docs = [(path, *_parse(path, display(path))) for path in loaded.chain]
    for depth in range(len(loc), 0, -1):
        for path, _, lines in docs:
            if loc[:depth] in lines:
                return path, f"{display(path)}:{lines[loc[:depth]]}"
    return loaded.path, display(loaded.path)


def _where(loc: tuple[str, ...], docs: list[tuple[Path, dict[str, Any], dict[tuple[str, ...], int]]]) -> str:
    """The file (child first) that sets the longest prefix of `loc`, with the line of that key."""
    for depth in range(len(loc), 0, -1):
        for path, _, lines in docs:
            if loc[:depth] in lines:
                return f"{display(path)}:{lines[loc[:depth]]}"
    return display(docs[0][0])
