"""The installed version of each distribution named in argv[1] (a JSON list), None where it is missing; one JSON
line (blocks/app/'s app-distributions check)."""

from __future__ import annotations

import importlib.metadata as md
import json
import sys

want = json.loads(sys.argv[1])
found: dict[str, str | None] = {}
for name in want:
    try:
        found[name] = md.version(name)
    except md.PackageNotFoundError:
        found[name] = None
print(json.dumps(found))
