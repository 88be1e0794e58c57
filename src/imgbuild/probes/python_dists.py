"""The Python distributions an interpreter of the image sees (Python 3.8 and newer): one JSON line with the
interpreter (argv[1]), its prefix and each distribution's name, version and location (publish/inventory.py)."""

from __future__ import annotations

import json
import sys
from importlib import metadata

dists = []
for d in metadata.distributions():
    name = d.metadata["Name"]
    if name:
        dists.append({"name": name, "version": d.version, "location": str(d.locate_file(""))})
print(json.dumps({"interpreter": sys.argv[1], "prefix": sys.prefix, "distributions": dists}))
