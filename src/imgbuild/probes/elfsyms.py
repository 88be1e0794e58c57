"""The dynamic symbols a shared library defines (what `nm -D --defined-only` lists), read from its ELF file with the
standard library only: an image's runtime stage need not have binutils, and nothing is loaded (dlopen would run the
library's constructors and fail on a missing dependency, which is another check's finding).

verify runs this file's text in the container (Python 3.8+): `python3 - '{"paths": [...], "prefixes": [...]}'` prints
one JSON line, path -> {"real": its real path, "symbols": the exported names starting with one of `prefixes`, sorted}
or {"error": why it could not be read}. Exported: defined (not SHN_UNDEF), global, weak or unique binding, default or
protected visibility, read from the SHT_DYNSYM section and its string table (32- and 64-bit, either byte order).
"""

from __future__ import annotations

import json
import os
import struct
import sys
from typing import Any

SHT_DYNSYM = 11
EXPORTED_BINDINGS = (1, 2, 10)  # STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE
EXPORTED_VISIBILITY = (0, 3)  # STV_DEFAULT, STV_PROTECTED


def dynamic_symbols(data: bytes) -> list[str]:
    """The names of the symbols an ELF shared library exports; ValueError when `data` is not one that can be read."""
    if data[:4] != b"\x7fELF":
        raise ValueError("not an ELF file")
    wide = {1: False, 2: True}.get(data[4])
    order = {1: "<", 2: ">"}.get(data[5])
    if wide is None or order is None:
        raise ValueError("unknown ELF class or byte order")
    if wide:
        shoff, shentsize, shnum = struct.unpack_from(order + "Q10xHH", data, 0x28)
        section, sym = order + "IIQQQQIIQQ", order + "IBBHQQ"
    else:
        shoff, shentsize, shnum = struct.unpack_from(order + "I10xHH", data, 0x20)
        section, sym = order + "IIIIIIIIII", order + "IIIBBH"
    if shoff == 0:
        raise ValueError("no section headers")
    if shnum == 0:  # more than 0xff00 sections: the count is section 0's sh_size
        shnum = struct.unpack_from(section, data, shoff)[5]
    sections = [struct.unpack_from(section, data, shoff + i * shentsize) for i in range(shnum)]
    dynsym = [s for s in sections if s[1] == SHT_DYNSYM]
    if not dynsym:
        raise ValueError("no dynamic symbol table")
    _, _, _, _, offset, size, link, _, _, entsize = dynsym[0]
    strtab = sections[link]
    strings = data[strtab[4] : strtab[4] + strtab[5]]
    names = []
    for i in range(1, size // entsize if entsize else 0):  # entry 0 is the null symbol
        fields = struct.unpack_from(sym, data, offset + i * entsize)
        if wide:
            name, info, other, shndx = fields[0], fields[1], fields[2], fields[3]
        else:
            name, info, other, shndx = fields[0], fields[3], fields[4], fields[5]
        if shndx == 0 or info >> 4 not in EXPORTED_BINDINGS or other & 3 not in EXPORTED_VISIBILITY:
            continue
        end = strings.find(b"\0", name)
        names.append(strings[name : end if end >= 0 else len(strings)].decode("utf-8", "replace"))
    return sorted(set(names))


def main(argv: list[str]) -> None:
    request = json.loads(argv[1])
    prefixes = tuple(request.get("prefixes") or [""])
    out: dict[str, Any] = {}
    for path in request["paths"]:
        try:
            with open(path, "rb") as f:
                symbols = dynamic_symbols(f.read())
            out[path] = {"real": os.path.realpath(path), "symbols": [s for s in symbols if s.startswith(prefixes)]}
        except (OSError, ValueError, struct.error, IndexError) as exc:
            out[path] = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv)
