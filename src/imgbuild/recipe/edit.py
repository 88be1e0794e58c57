"""Change one value in a recipe file the way a person would: that value's text and nothing else.

Recipes are YAML files their users own, with comments and a layout of their choosing. The edit is made by a
round-trip YAML library (ruamel.yaml keeps comments, key order, quoting and flow or block style): the file is loaded,
the value set (or its key added at the end of the innermost mapping the file has on its path, in that mapping's
style), and dumped. A whole dump would still restyle lines the edit never touched (ruamel re-wraps a multi-line quoted
string and writes `null` as nothing), so only the edit's lines are taken from it: the lines in which the dump of the
edited document differs from the dump of the file as it was, put where those lines stand in the file. The caller loads
the file again afterwards and checks that it now says what was meant (imgbuild.pin.outdated does).
"""

from __future__ import annotations

import difflib
import io
import re
from collections.abc import Sequence
from typing import Any

import yaml
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import YAMLError
from ruamel.yaml.scalarstring import DoubleQuotedScalarString, SingleQuotedScalarString
from ruamel.yaml.util import load_yaml_guess_indent

from imgbuild.core.errors import RecipeError

# What a version (or any value this module writes) may be: text that needs no escaping in either YAML quote style.
_VALUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+_-]*")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NESTED_KEY = re.compile(r"^( +)[A-Za-z_][A-Za-z0-9_.-]*:(?:\s|$)", re.MULTILINE)


def set_value(text: str, keys: Sequence[str], value: str, *, where: str) -> str:
    """`text` (a recipe file) with `keys` (components, pytorch, version) set to `value`, comments and layout kept.

    An existing scalar keeps its quote style (quoted where plain text would read as a number: `13.2`); a missing key
    is added to the innermost mapping the file has on its path, in that mapping's style. RecipeError, naming `where`
    (the file) and the key path, when the path runs into something that is not a mapping or a removed (null) block,
    or when the edit cannot be made without rewriting other lines of the file."""
    path = ".".join(keys)
    if not keys or not all(_KEY.fullmatch(k) for k in keys):
        raise RecipeError(f"{where}: cannot set {path!r}: expected a path of plain key names")
    if not _VALUE.fullmatch(value):
        raise RecipeError(f"{where}: {path}: cannot write {value!r}: expected a version-like value")
    ended = text.endswith("\n") or not text
    source = text if ended else text + "\n"
    try:
        _, sequence, offset = load_yaml_guess_indent(source)  # a block sequence's indent and its dash's offset
        rt = _round_trip(source, _mapping_indent(source), sequence or 2, offset or 0)
        before = _dump(rt, rt.load(source))
        document = rt.load(source)
    except YAMLError as exc:
        raise RecipeError(f"{where}: cannot read the file to edit it: {exc}") from None
    _set(document, keys, value, where)
    lines = _apply(source.splitlines(keepends=True), before, _dump(rt, document), path, where)
    result = "".join(lines)
    return result if ended else result[:-1]


def _mapping_indent(text: str) -> int:
    """How far the file indents a nested block mapping's keys: the first indented `key:` line's indent, else 2."""
    found = _NESTED_KEY.search(text)
    return len(found.group(1)) if found else 2


def _round_trip(text: str, mapping: int, sequence: int, offset: int) -> YAML:
    rt = YAML()  # round-trip
    rt.preserve_quotes = True
    rt.width = 1 << 20  # the edit's own line is never folded
    rt.indent(mapping=mapping, sequence=max(sequence, offset + 2), offset=offset)
    rt.explicit_start = text.startswith("---")
    rt.representer.add_representer(type(None), lambda r, _: r.represent_scalar("tag:yaml.org,2002:null", "null"))
    return rt


def _dump(rt: YAML, document: Any) -> list[str]:
    out = io.StringIO()
    rt.dump(document, out)
    return out.getvalue().splitlines(keepends=True)


def _set(document: Any, keys: Sequence[str], value: str, where: str) -> None:
    node = document
    for depth, key in enumerate(keys):
        path = ".".join(keys[: depth + 1])
        if not isinstance(node, CommentedMap):
            raise RecipeError(f"{where}: {'.'.join(keys[:depth]) or 'the document'}: expected a mapping to set {path}")
        if key not in node:
            node[key] = _new(keys[depth + 1 :], value, block=not node.fa.flow_style())
            return
        child = node[key]
        if depth < len(keys) - 1 and child is None:
            raise RecipeError(f"{where}: {path} is null (removed), so it has no {keys[depth + 1]} to set")
        if depth == len(keys) - 1:
            if isinstance(child, (CommentedMap, CommentedSeq)):
                found = "mapping" if isinstance(child, CommentedMap) else "list"
                raise RecipeError(f"{where}: {path}: expected a single value, found a {found}")
            node[key] = _scalar(value, child)
            return
        node = child


def _scalar(value: str, old: Any = None) -> str:
    """`value` in the old value's quote style, or plain when plain text reads back as the same string."""
    if isinstance(old, (SingleQuotedScalarString, DoubleQuotedScalarString)):
        return type(old)(value)
    return value if yaml.safe_load(value) == value else DoubleQuotedScalarString(value)


def _new(keys: Sequence[str], value: str, *, block: bool) -> Any:
    """What a new key holds: the value, or for a deeper path a mapping: `{version: 2.15.0}` for one more key; in block
    context a longer path opens block mappings first (`components:` then an indented line)."""
    if not keys:
        return _scalar(value)
    mapping = CommentedMap({keys[0]: _new(keys[1:], value, block=block and len(keys) > 2)})
    if block and len(keys) > 1:
        mapping.fa.set_block_style()
    else:
        mapping.fa.set_flow_style()
    return mapping


def _apply(original: list[str], before: list[str], after: list[str], path: str, where: str) -> list[str]:
    """`original` with the lines in which `after` (the edited dump) differs from `before` (the dump of the file as it
    was) changed: each such line must stand unchanged in `original` (a line of the file the dump restyled is not
    touched), and an added line goes where the dump puts it, moved up past the comments and blank lines before it (the
    dump puts a new last key after the comments that end its mapping)."""
    at = {}  # before's line -> original's line, where the dump kept the line as the file has it
    for block in difflib.SequenceMatcher(None, original, before, autojunk=False).get_matching_blocks():
        at.update({block.b + k: block.a + k for k in range(block.size)})

    def cannot() -> RecipeError:
        return RecipeError(f"{where}: cannot set {path} without rewriting lines around it; set it by hand")

    out = list(original)
    opcodes = difflib.SequenceMatcher(None, before, after, autojunk=False).get_opcodes()
    for tag, i1, i2, j1, j2 in reversed(opcodes):
        if tag == "equal":
            continue
        if tag == "insert":
            while i1 > 0 and (not before[i1 - 1].strip() or before[i1 - 1].lstrip().startswith("#")):
                i1 -= 1
            if i1 in at:  # before the line that follows (the one before may be a line the dump restyled)
                start = at[i1]
            elif i1 == len(before):
                start = len(original)
            elif i1 - 1 in at:
                start = at[i1 - 1] + 1
            else:
                raise cannot()
            end = start
        else:
            rows = [at.get(i) for i in range(i1, i2)]
            if None in rows or rows != list(range(rows[0] or 0, (rows[0] or 0) + len(rows))):
                raise cannot()
            start, end = rows[0] or 0, (rows[-1] or 0) + 1
        out[start:end] = after[j1:j2]
    return out
