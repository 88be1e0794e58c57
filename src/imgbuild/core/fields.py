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


class Strict(BaseModel):
    """Every schema object: unknown keys are errors, objects are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
