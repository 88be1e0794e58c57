"""Change one value in a recipe file the way a person would: that value's text and nothing else.

Recipes are YAML files their users own, with comments and a layout of their choosing; a YAML dump would lose both.
`set_value` finds the value's place from the marks PyYAML's composer gives every node and replaces that text, or,
when the file does not set the key, adds one line for it where its mapping ends (or one entry inside a flow mapping
`{...}`). The caller loads the file again afterwards and checks that it now says what was meant (imgbuild.pin.
outdated does): this module edits text, it does not prove the result.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import yaml

from imgbuild.core.errors import RecipeError

# What a version (or any value this module writes) may be: text that needs no escaping in either YAML quote style.
_VALUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+_-]*")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def set_value(text: str, keys: Sequence[str], value: str, *, where: str) -> str:
    """`text` (a recipe file) with `keys` (components, pytorch, version) set to `value`, comments and layout kept.

    An existing scalar keeps its quote style (quoted where plain text would read as a number: `13.2`); a missing key
    is added to the innermost mapping the file has on its path, in that mapping's style. RecipeError, naming `where`
    (the file) and the key path, when the path runs into something that is not a mapping or a removed (null) block."""
    if not keys or not all(_KEY.fullmatch(k) for k in keys):
        raise RecipeError(f"{where}: cannot set {'.'.join(keys)!r}: expected a path of plain key names")
    if not _VALUE.fullmatch(value):
        raise RecipeError(f"{where}: {'.'.join(keys)}: cannot write {value!r}: expected a version-like value")
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise RecipeError(f"{where}: cannot read the file to edit it: {exc}") from None
    for depth, key in enumerate(keys):
        path = ".".join(keys[: depth + 1])
        if not isinstance(node, yaml.MappingNode):
            raise RecipeError(f"{where}: {'.'.join(keys[:depth]) or 'the document'}: expected a mapping to set {path}")
        child = next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == key), None)
        if child is None:
            return _insert(text, node, keys[depth:], value, where)
        if depth < len(keys) - 1 and isinstance(child, yaml.ScalarNode) and child.tag.endswith(":null"):
            raise RecipeError(f"{where}: {path} is null (removed), so it has no {keys[depth + 1]} to set")
        node = child
    if not isinstance(node, yaml.ScalarNode):
        raise RecipeError(f"{where}: {'.'.join(keys)}: expected a single value, found a {type(node).__name__}")
    start, end = node.start_mark.index, node.end_mark.index
    return text[:start] + _scalar(value, node.style) + text[end:]


def _scalar(value: str, style: str | None) -> str:
    """`value` as YAML text: in the old value's quote style, or plain when plain text reads back as the same string."""
    if style in ("'", '"'):
        return f"{style}{value}{style}"
    return value if yaml.safe_load(value) == value else f'"{value}"'


def _entry(keys: Sequence[str], value: str, indent: int, block: bool) -> str:
    """The text that sets `keys` to `value` where none of them exists yet: `pytorch: {version: 2.15.0}` for two keys;
    in block context a deeper path opens block mappings first (`components:` then an indented line)."""
    if block and len(keys) > 2:
        return f"{keys[0]}:\n{' ' * (indent + 2)}" + _entry(keys[1:], value, indent + 2, True)
    if len(keys) == 1:
        return f"{keys[0]}: {_scalar(value, None)}"
    return f"{keys[0]}: {{{_entry(keys[1:], value, 0, False)}}}"


def _insert(text: str, mapping: yaml.MappingNode, keys: Sequence[str], value: str, where: str) -> str:
    if mapping.flow_style:
        close = mapping.end_mark.index - 1
        if text[close : close + 1] != "}":
            raise RecipeError(f"{where}: line {mapping.end_mark.line + 1}: cannot find the end of a flow mapping")
        entry = _entry(keys, value, 0, False)
        if not mapping.value:
            return text[:close] + entry + text[close:]
        at = len(text[:close].rstrip())
        return text[:at] + ", " + entry + text[at:]
    if not mapping.value:
        raise RecipeError(f"{where}: line {mapping.start_mark.line + 1}: cannot add {keys[0]} to an empty mapping")
    indent = mapping.value[0][0].start_mark.column
    at = _line_end(text, _last_leaf_end(mapping))
    return text[:at] + "\n" + " " * indent + _entry(keys, value, indent, True) + text[at:]


def _last_leaf_end(node: yaml.Node) -> int:
    """Where the text of a block collection's last value ends (a block collection's own end mark is the next token,
    which may be lines further on, past comments)."""
    while isinstance(node, (yaml.MappingNode, yaml.SequenceNode)) and not node.flow_style and node.value:
        last = node.value[-1]
        node = last[1] if isinstance(node, yaml.MappingNode) else last
    return int(node.end_mark.index)


def _line_end(text: str, index: int) -> int:
    """The end of the line `index` is on (before its newline; the text's end on a last line without one). An index
    just past a newline (a value that ends its line) belongs to the line before."""
    if index > 0 and text[index - 1] == "\n":
        return index - 1
    found = text.find("\n", index)
    return len(text) if found < 0 else found
