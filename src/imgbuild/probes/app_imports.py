"""Imports each module of the distributions in argv[1] (their top-level modules, from their metadata) and those in
argv[2] (the recipe's `imports`), then reads this process's memory map: every libnccl and libmpi it loaded, resolved;
and the extension modules of the distributions built from source in argv[3]. One JSON line (blocks/app/)."""

from __future__ import annotations

import importlib
import importlib.metadata as md
import json
import os
import sys

dists, extra, built = json.loads(sys.argv[1]), json.loads(sys.argv[2]), set(json.loads(sys.argv[3]))
modules = {}
for dist in dists:
    try:
        top = (md.distribution(dist).read_text("top_level.txt") or "").split()
        if not top:
            files = md.distribution(dist).files or []
            top = sorted(
                {
                    str(f).split("/")[0].removesuffix(".py")
                    for f in files
                    if (str(f).endswith(".py") or "/" in str(f))
                    and ".dist-info" not in str(f)
                    and ".data" not in str(f).split("/")[0]
                    and not str(f).startswith("..")
                }
            )
    except md.PackageNotFoundError:
        top = []
    modules[dist] = [m for m in top if m.isidentifier() and not m.startswith("_")] or [dist.replace("-", "_")]
errors, ok = {}, []
for name in [m for ms in modules.values() for m in ms] + extra:
    try:
        importlib.import_module(name)
        ok.append(name)
    except Exception as exc:
        errors[name] = f"{type(exc).__name__}: {exc}"
libs: dict[str, set[str]] = {}
with open("/proc/self/maps") as maps:
    for line in maps:
        parts = line.split()
        path = parts[-1] if len(parts) >= 6 else ""
        base = os.path.basename(path)
        if base.startswith(("libnccl.so", "libmpi.so")):
            libs.setdefault(base.split(".so")[0], set()).add(os.path.realpath(path))
ext = {}
for dist in built:
    try:
        files = md.distribution(dist).files or []
    except md.PackageNotFoundError:
        continue
    ext[dist] = [str(f.locate()) for f in files if ".so" in str(f).rsplit("/", 1)[-1]]
print(
    json.dumps(
        {
            "modules": modules,
            "ok": ok,
            "errors": errors,
            "libs": {k: sorted(v) for k, v in libs.items()},
            "extensions": ext,
        }
    )
)
