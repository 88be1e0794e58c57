"""Recipes: YAML files that describe a target image, loaded and validated against the recipe model
(imgbuild.recipe.model).

A recipe may `extends:` another (a shipped recipe's name, or a path relative to the file). Parents are merged
into children key by key: mappings merge recursively, lists and scalars are replaced, and `null` removes an
inherited key (e.g. `components: {pytorch: null}`). Unknown keys are rejected with a "did you mean"; every error
names the file, the line, the key path and what was expected.
"""

from __future__ import annotations

import difflib
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from imgbuild.core import files, paths
from imgbuild.core.errors import RecipeError
from imgbuild.core.paths import display
from imgbuild.recipe.model import LoadedRecipe, Recipe


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
    from imgbuild.blocks import REGISTRY, RecipeRules

    broken = [
        found
        for block in REGISTRY
        if isinstance(block, RecipeRules)
        if (found := block.recipe_rule(recipe)) is not None
    ]
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
