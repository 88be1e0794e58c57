"""Schema building blocks shared by the recipe and by every component's options: strict models and pinned
versions. A leaf module (it imports nothing of imgbuild), so component modules and recipe.py both use it."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

_VERSION_RE = re.compile(r"^\d+(\.\d+){1,3}((a|b|rc|post|dev)\d+|[+-][A-Za-z0-9.]+)?$")
_UNPINNED = ("latest", "*", ">", "<", "~", "^", "=", "!", ",", " ")


def pinned(value: str) -> str:
    """An exact version, or ValueError (unpinned versions such as 'latest' or '>=2' are refused)."""
    text = str(value).strip()
    if text.lower() == "latest" or any(mark in text for mark in _UNPINNED[1:]) or not _VERSION_RE.match(text):
        raise ValueError(f"an exact version such as 2.21.5 (unpinned versions are not allowed), got {value!r}")
    return text


def pin_validator(*names: str) -> Any:
    """A pydantic validator that makes the named fields exact versions (None stays None)."""
    return field_validator(*names, mode="before")(lambda cls, v: v if v is None else pinned(str(v)))


Port = Annotated[int, Field(ge=1, le=65535)]
Digest = Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
# An absolute path made of plain characters: it reaches RUN lines and shell scripts unquoted.
AbsPath = Annotated[str, Field(pattern=r"^/[A-Za-z0-9._/+-]*$")]


class Strict(BaseModel):
    """Every schema object: unknown keys are errors, objects are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)
