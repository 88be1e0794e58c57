"""Finds libnccl.so.2 in the usual places and the globs of argv[1] (a JSON list), loads it and asks ncclGetVersion
(no GPU needed), and reads the version macros of the nccl.h next to it; stdlib only. One JSON line (blocks/nccl/)."""

from __future__ import annotations

import ctypes
import glob
import json
import os
import re
import subprocess
import sys

dirs: list[str] = []


def add(d):
    if d and d not in dirs:
        dirs.append(d)


for pattern in json.loads(sys.argv[1]):
    for d in sorted(glob.glob(pattern)):
        add(d)
for p in sys.path:
    add(os.path.join(p, "nvidia", "nccl", "lib"))
try:
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.origin:
        site = os.path.dirname(os.path.dirname(spec.origin))
        add(os.path.join(site, "nvidia", "nccl", "lib"))
        add(os.path.join(os.path.dirname(spec.origin), "lib"))
except Exception:
    pass
for d in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
    add(d)
found = [os.path.join(d, "libnccl.so.2") for d in dirs if os.path.isfile(os.path.join(d, "libnccl.so.2"))]
for ldconfig in ("ldconfig", "/sbin/ldconfig"):
    try:
        out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True).stdout
    except OSError:
        continue
    for line in out.splitlines():
        if line.strip().startswith("libnccl.so.2 ") and "=>" in line:
            path = line.split("=>")[-1].strip()
            if path not in found:
                found.append(path)
    break
res: dict[str, object] = {"candidates": found}
if found:
    lib = found[0]
    res["lib"] = lib
    res["real"] = os.path.realpath(lib)
    try:
        handle = ctypes.CDLL(lib)
        code = ctypes.c_int(0)
        res["rc"] = handle.ncclGetVersion(ctypes.byref(code))
        res["code"] = code.value
    except Exception as exc:
        res["error"] = f"{type(exc).__name__}: {exc}"
    libdir = os.path.dirname(lib)
    for hdr in (
        os.path.join(os.path.dirname(libdir), "include", "nccl.h"),
        os.path.join(os.path.dirname(os.path.dirname(libdir)), "include", "nccl.h"),
        "/usr/include/nccl.h",
    ):
        if os.path.isfile(hdr):
            with open(hdr, errors="replace") as f:
                text = f.read()
            macros = dict(re.findall(r"#define\s+NCCL_(MAJOR|MINOR|PATCH)\s+(\d+)", text))
            res["header"] = {"path": hdr, **macros}
            break
print(json.dumps(res))
