"""Version strings compared as releases: one rule for whether two versions a lock, a table or a package index gives
name one release."""

from __future__ import annotations

from packaging.version import InvalidVersion, Version


def same_version(a: str, b: str) -> bool:
    """Whether two version strings name one release: equal by PEP 440 (2.27.5 and 2.27.5.0, +cu128 kept), or by
    their text where either is not a PEP 440 version."""
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b
