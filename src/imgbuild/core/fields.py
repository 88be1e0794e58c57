"""The field types every recipe and block model is written in, shared by the recipe and by every component's
options: strict models, pinned versions, and the string types of everything a recipe sends into a Dockerfile, a shell
script or a command line. A leaf module (of imgbuild it imports only validate.py, the grammars of command-line
values), so component modules and the recipe model (imgbuild.recipe.model) both use it.

Every free-form string of a recipe is one of these types: either a restricted form (package names, paths,
interface names...) that needs no quoting wherever it lands, or `Text` (one line, no control characters) that
every place it reaches quotes (Dockerfile ENV/LABEL: render's `kvlines`; shell scripts: `shquote`/shlex).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from imgbuild.core import validate

_VERSION_RE = re.compile(r"^\d+(\.\d+){1,3}((a|b|rc|post|dev)\d+|[+-][A-Za-z0-9.]+)?$", re.ASCII)
_UNPINNED = ("latest", "*", ">", "<", "~", "^", "=", "!", ",", " ")


def pinned(value: str) -> str:
    """An exact version, or ValueError (unpinned versions such as 'latest' or '>=2' are refused)."""
    text = str(value).strip()
    if text.lower() == "latest" or any(mark in text for mark in _UNPINNED[1:]) or not _VERSION_RE.match(text):
        raise ValueError(f"expected an exact version such as 2.21.5 (unpinned versions are not allowed), got {value!r}")
    return text


def pin_validator(*names: str) -> Any:
    """A pydantic validator that makes the named fields exact versions (None stays None)."""
    return field_validator(*names, mode="before")(lambda cls, v: v if v is None else pinned(str(v)))


# Line breaks for Docker's parser and for shells: control characters (newline, CR, tab, NUL, ESC...) and the
# Unicode line and paragraph separators.
_NOT_ONE_LINE = ("Cc", "Zl", "Zp")


def one_line(value: str) -> str:
    """`value` when it is one line of text without control characters, else ValueError.

    A Dockerfile instruction cannot hold a newline inside a value (a line ends the instruction; Docker keeps an
    escaped `\\n` as those two characters), so such a value could never reach the image as written.
    """
    bad = next((c for c in value if unicodedata.category(c) in _NOT_ONE_LINE), None)
    if bad is not None:
        raise ValueError(f"expected one line of text without control characters (found {bad!r})")
    return value


def matching(pattern: str, expected: str) -> Callable[[str], str]:
    """A validator: the whole value matches `pattern`, else ValueError saying what was expected. The pattern is
    compiled when a value is first checked: a recipe uses a few of the many patterns its models declare (each
    compiled at import was a part of every command's start-up)."""

    def check(value: str) -> str:
        if re.fullmatch(pattern, value, re.ASCII) is None:
            raise ValueError(f"expected {expected}")
        return value

    return check


Port = Annotated[int, Field(ge=1, le=65535)]
Digest = Annotated[str, AfterValidator(matching(r"sha256:[0-9a-f]{64}", "sha256: and 64 lowercase hex digits"))]
EnvName = Annotated[
    str,
    AfterValidator(
        matching(r"[A-Za-z_][A-Za-z0-9_]*", "a variable name of letters, digits and _, not starting with a digit")
    ),
]
# Free text: quoted wherever it is used (Dockerfile ENV/LABEL values, mpirun arguments in `train`).
Text = Annotated[str, AfterValidator(one_line)]
# The types below reach RUN lines, shell scripts and command lines unquoted: plain characters only.
AbsPath = Annotated[
    str, AfterValidator(matching(r"/[A-Za-z0-9._/+-]*", "an absolute path of letters, digits and . _ / + -"))
]
# Debian policy 5.6.1 (names) and 5.6.12 (versions: [epoch:]upstream[-revision]) as apt-get takes `name=version`.
DebPackage = Annotated[
    str,
    AfterValidator(
        matching(
            r"[a-z0-9][a-z0-9+.-]+(=([0-9]+:)?[0-9][A-Za-z0-9.+~-]*)?",
            "a Debian package name (lowercase letters, digits, + - .), optionally =VERSION",
        )
    ),
]
LabelKey = Annotated[
    str,
    AfterValidator(
        matching(r"[A-Za-z0-9][A-Za-z0-9._/-]*", "a label key of letters, digits and . _ / - (org.example.team)")
    ),
]
# A network interface name (eth0, ens5) or, where Open MPI takes one, a subnet (10.0.0.0/8).
Interface = Annotated[
    str, AfterValidator(matching(r"[A-Za-z0-9_.:@/-]+", "an interface name or subnet (eth0, 10.0.0.0/8)"))
]
# NCCL's interface selector: `^` excludes, `=` matches exactly, a comma-separated list of prefixes.
NcclInterfaces = Annotated[
    str,
    AfterValidator(
        matching(
            r"\^?=?[A-Za-z0-9_.:@-]+(,[A-Za-z0-9_.:@-]+)*",
            "NCCL's interface list: prefixes separated by commas, optionally led by ^ (exclude) or = (exact)",
        )
    ),
]
McaName = Annotated[
    str,
    AfterValidator(matching(r"[A-Za-z0-9_]+", "an MCA parameter name of letters, digits and _ (btl_tcp_if_include)")),
]
# A program's name on PATH or its absolute path.
Command = Annotated[
    str,
    AfterValidator(matching(r"[A-Za-z0-9_.+/-]+", "a command name or path (mpirun, /opt/amazon/openmpi/bin/mpirun)")),
]
Capability = Annotated[str, AfterValidator(matching(r"[A-Za-z_]+", "a Linux capability name (SYS_PTRACE, sys_nice)"))]
# The grammar `imgbuild cluster job --instance-type` checks too (validate.py): one dot, a label value's 63 characters.
InstanceType = Annotated[
    str,
    Field(max_length=validate.INSTANCE_TYPE_MAX),
    AfterValidator(matching(validate.INSTANCE_TYPE_PATTERN, validate.INSTANCE_TYPE_EXPECTED)),
]


def _attribute_docstrings(cls: type[BaseModel]) -> dict[str, str]:
    """The docstring written under each field of `cls` and of its bases (`name: T = ...` then a string), by name."""
    import ast
    import inspect
    import itertools

    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not issubclass(klass, BaseModel) or klass is BaseModel:
            continue
        body = _module_tree(klass.__module__).body
        for part in klass.__qualname__.replace(".<locals>", "").split("."):  # a class in a class or function too
            body = next((n.body for n in body if isinstance(n, ast.ClassDef | ast.FunctionDef) and n.name == part), [])
        for field, doc in itertools.pairwise(body):
            if (
                isinstance(field, ast.AnnAssign)
                and isinstance(field.target, ast.Name)
                and isinstance(doc, ast.Expr)
                and isinstance(doc.value, ast.Constant)
                and isinstance(doc.value.value, str)
            ):
                found[field.target.id] = inspect.cleandoc(doc.value.value)
    return found


_TREES: dict[str, Any] = {}


def _module_tree(name: str) -> Any:
    """Module `name`'s parsed source (an empty module where it has none), parsed once."""
    import ast
    import inspect
    import sys

    if name not in _TREES:
        try:
            _TREES[name] = ast.parse(inspect.getsource(sys.modules[name]))
        except (KeyError, OSError, TypeError):
            _TREES[name] = ast.Module(body=[], type_ignores=[])
    return _TREES[name]


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model `annotation` names (`Model`, `Model | None`), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for a in getattr(annotation, "__args__", ()) if (m := _model_in(a)) is not None), None)


def field_descriptions(schema: dict[str, Any], cls: type[BaseModel]) -> None:
    """Each key's description in a model's JSON Schema (`imgbuild schema`, the docs' recipe keys): the docstring
    written under its field, or for a section (a field whose type is a model) without one, that model's docstring.
    Read from the source when a schema is made, not at import as pydantic's `use_attribute_docstrings` does (that
    reads every model's source when its class is made: tens of milliseconds of every command's start-up)."""
    import inspect

    docs = _attribute_docstrings(cls)
    for name, prop in schema.get("properties", {}).items():
        field = cls.model_fields.get(name)
        section = _model_in(field.annotation) if field is not None else None
        text = docs.get(name) or (section.__doc__ if section is not None else None)
        if text and not prop.get("description"):
            prop["description"] = inspect.cleandoc(text)


class Strict(BaseModel):
    """Every schema object: unknown keys are errors, objects are immutable. Each field's help is the docstring
    under it (`field_descriptions`: the JSON Schema's descriptions)."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True, json_schema_extra=field_descriptions)
