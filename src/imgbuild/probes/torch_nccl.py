"""Imports torch (without a GPU too), asks which NCCL it was built with, finds the libnccl this very process loaded
from its own memory map (not by guessing a path), then asks that library its version. One JSON line
(blocks/pytorch/)."""

from __future__ import annotations

import ctypes
import json
import os

import torch

try:
    nccl = torch.cuda.nccl.version()
except Exception as exc:
    nccl = f"error: {exc}"
loaded = []
with open("/proc/self/maps") as maps:
    for line in maps:
        path = line.split()[-1] if len(line.split()) >= 6 else ""
        if "/libnccl.so" in path and path not in loaded:
            loaded.append(path)
res = {
    "version": torch.__version__,
    "nccl": nccl,
    "cuda": torch.version.cuda,
    "cuda_available": torch.cuda.is_available(),
    "loaded_nccl": loaded,
}
if loaded:
    try:
        code = ctypes.c_int(0)
        res["loaded_rc"] = ctypes.CDLL(loaded[0]).ncclGetVersion(ctypes.byref(code))
        res["loaded_code"] = code.value
        res["loaded_real"] = os.path.realpath(loaded[0])
    except Exception as exc:
        res["loaded_error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(res))
