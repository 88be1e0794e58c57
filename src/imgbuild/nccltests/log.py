"""Read an nccl-tests log (or any NCCL_DEBUG=INFO log) into typed data: `parse(text)` -> `ParsedLog`.

A pure function, no I/O, that never fails: what a log does not say stays empty. verdict.py judges what it finds.

What the parser understands, from the logs in tests/data/upstream/nccl-tests:
- line prefixes: Open MPI's `--tag-output` (`[1,0]<stdout>:`) and `srun -l` (`0: `), also indented;
- both result tables: nccl-tests before 2.13 (`redop`, then `time algbw busbw error` twice) and since
  (`redop root`, then `time algbw busbw #wrong` twice); out-of-place first, in-place second; NCCL INFO lines
  interleaved with the rows; `# Out of bounds values : N OK|FAILED`; `# Avg bus bandwidth : X`; `#wrong` as
  nccl-tests prints it, with `%g` (`6.71089e+07`); `nan`, `inf` and negative numbers are kept as printed (the
  report judges them). A line under a table header that starts like a row (a size) but cannot be read as one is
  kept, with its line number, in `ResultTable.unreadable`: no row is dropped silently;
- `NCCL version 2.x.y+cudaZ` (with or without the `NCCL INFO` prefix) and nccl-tests' `nccl-library=` code;
- the network, in the wordings of NCCL 2.4 to 2.29 and aws-ofi-nccl 1.1 to 1.18: `Using network X`,
  `Assigned NET plugin X`, `via NET/X/0`, `Selected provider is efa, fabric is efa (found N nics)` (and the
  older `Selected Provider is efa`), the plugin failing (`No eligible providers were found`, `initialization
  failed`, `Failed to initialize sendrecv protocol`, ...) and NCCL not finding it (`No plugin found
  (libnccl-net.so)`, `Could not find: libnccl-net.so. Using internal net plugin.`, `Plugin load returned`, a
  dlopen error);
- the run's shape: the `#  Rank N ... on HOST device D` lines, NCCL's `nNodes N`, and the instance type when
  aws-ofi-nccl names it (`Running on p4d.24xlarge platform`, the 1.1-era `Running on P4d platform`, `not
  available for platform : g7e.8xlarge`).

Time and memory are linear in the log's size whatever its shape (one 3 MB line from a JSON export, long runs of
spaces, a phrase repeated thousands of times on a line): no pattern here scans to the end of a line from each of
several starts (`.*` before a phrase, `.*?` before `$`). Where a finding is "the rest of the line" it is cut
with str methods after a bounded match, and kept to `_KEEP` characters.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema


class Frozen(BaseModel):
    """The base of a log's models and of its verdict's: immutable, unknown fields refused."""

    # JSON has no NaN or Infinity: a log's `nan` or `inf` is written as the string "NaN", "Infinity", "-Infinity".
    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="strings")


# A number as the log printed it: nan and inf are kept (the report fails them), and JSON carries them as strings.
Printed = Annotated[float, WithJsonSchema({"anyOf": [{"type": "number"}, {"enum": ["NaN", "Infinity", "-Infinity"]}]})]


class Measurement(Frozen):
    """One half of a result row (out-of-place or in-place)."""

    time_us: Printed
    algbw: Printed
    busbw: Printed
    wrong: int | None = Field(
        None,
        description="'#wrong' (nccl-tests 2.13+; printed with %g, so large counts are rounded to 6 digits); "
        "null: old table, or N/A (-c 0)",
    )
    error: Printed | None = Field(None, description="'error' of older nccl-tests (max relative error); null if N/A")

    @property
    def sound(self) -> bool:
        """Time and bandwidths are finite and not negative: a measurement, not broken arithmetic."""
        return all(math.isfinite(v) and v >= 0 for v in (self.time_us, self.algbw, self.busbw))


class Row(Frozen):
    size: int = Field(description="bytes")
    count: int
    type: str
    redop: str
    root: int | None = Field(description="null in the old table, which has no root column")
    out_of_place: Measurement
    in_place: Measurement

    @property
    def busbw(self) -> float:
        """The lower of the two bus bandwidths: what a run is judged by; nan when either half is not a sound
        measurement (min() would otherwise pick whichever half comes first when one is nan)."""
        if not self.sound:
            return math.nan
        return min(self.out_of_place.busbw, self.in_place.busbw)

    @property
    def sound(self) -> bool:
        return self.out_of_place.sound and self.in_place.sound


class ResultTable(Frozen):
    """One nccl-tests result table and its footer."""

    collective: str | None = Field(description="e.g. all_reduce_perf; null when the log does not name it")
    layout: Literal["wrong", "error"] = Field(description="'wrong': nccl-tests 2.13+; 'error': older")
    rows: tuple[Row, ...]
    unreadable: tuple[str, ...] = Field(
        (), description="'line N: text' of each line under the header that starts like a row but could not be read"
    )
    out_of_bounds: int | None = None
    out_of_bounds_ok: bool | None = None
    footer: bool = Field(False, description="the table ended with 'Avg bus bandwidth' or 'Collective test concluded'")
    avg_busbw: Printed | None = Field(None, description="'Avg bus bandwidth': a mean over the sizes run, not a verdict")
    min_bytes: int | None = None
    max_bytes: int | None = None

    def at(self, size: int) -> Row | None:
        """The row of `size`; where the table lists it more than once (two runs in one log), the worst of them: an
        unsound one first, else the one of least bus bandwidth."""
        found = [r for r in self.rows if r.size == size]
        if not found:
            return None
        unsound = [r for r in found if not r.sound]
        return unsound[0] if unsound else min(found, key=lambda r: r.busbw)

    @property
    def repeated(self) -> dict[int, int]:
        """Sizes the table lists more than once for one data type, reduction and root -> how many times (a run
        appended to another under one header; `-d all` and `-o all` list a size once per type and operation; size 0 is
        left out)."""
        counts: dict[tuple[int, str, str | None, int | None], int] = {}
        for r in self.rows:
            if r.size == 0:  # -b 0: nccl-tests prints the empty size twice as it steps past it
                continue
            key = (r.size, r.type, r.redop, r.root)
            counts[key] = counts.get(key, 0) + 1
        out: dict[int, int] = {}
        for (size, *_), n in counts.items():
            if n > 1:
                out[size] = max(out.get(size, 0), n)
        return out

    @property
    def sizes(self) -> tuple[int, int] | None:
        """The smallest and largest size measured (from the rows; the header's -b/-e when there are none)."""
        measured = [r.size for r in self.rows if r.size > 0]
        if measured:
            return min(measured), max(measured)
        if self.min_bytes is not None and self.max_bytes is not None:
            return self.min_bytes, self.max_bytes
        return None


class Network(Frozen):
    """What the log says about the network NCCL used between nodes."""

    used: tuple[str, ...] = Field((), description="NCCL's names: 'Libfabric', 'AWS Libfabric', 'Socket', 'IB'")
    providers: tuple[str, ...] = Field((), description="libfabric providers aws-ofi-nccl selected, over the ranks")
    fabric: str | None = None
    nics: tuple[int, ...] = Field((), description="'found N nics', distinct values over the ranks")
    plugin_version: str | None = Field(None, description="aws-ofi-nccl, as it prints itself")
    libfabric: str | None = None
    provider_filter: str | None = None
    failures: tuple[str, ...] = Field((), description="aws-ofi-nccl failing, distinct messages, first seen first")
    missing: tuple[str, ...] = Field((), description="NCCL finding no net plugin or failing to load it")
    warnings: tuple[str, ...] = Field((), description="other 'NCCL WARN NET/...' lines")


class ParsedLog(Frozen):
    nccl_versions: tuple[str, ...] = ()
    cuda_versions: tuple[str, ...] = ()
    nccl_tests_version: str | None = None
    instance_types: tuple[str, ...] = ()
    instance_type_evidence: str | None = Field(None, description="the line naming the instance type")
    hosts: tuple[str, ...] = Field((), description="from nccl-tests' '#  Rank N ... on HOST' lines")
    ranks: int | None = None
    nnodes: int | None = Field(None, description="the largest 'nNodes N' NCCL printed")
    network: Network = Network()
    tables: tuple[ResultTable, ...] = ()

    @property
    def nodes(self) -> int | None:
        return len(self.hosts) if self.hosts else self.nnodes

    @property
    def gpus_per_node(self) -> int | None:
        if self.hosts and self.ranks and self.ranks % len(self.hosts) == 0:
            return self.ranks // len(self.hosts)
        return None


_PREFIX = re.compile(r"^\s*(?:\[\d+,\d+\]<std(?:out|err)>:|\d+: )")
_NCCL_VERSION = re.compile(r"\bNCCL version (\d+\.\d+\.\d+)(?:\+cuda(\d+(?:\.\d+)*))?")
_TESTS_VERSION = re.compile(r"nccl-tests version (\S+)")
_LIBRARY = re.compile(r"\bnccl-library=(\d{1,18})")
_COLLECTIVE = re.compile(
    r"\b((?:all_reduce|all_gather|alltoall|broadcast|reduce_scatter|reduce|gather|scatter|sendrecv|hypercube)_perf)"
)
_TEST_HEADER = re.compile(r"#\s*nThread\s+\d+\s+nGpus\s+\d+\s+minBytes\s+(\d{1,18})\s+maxBytes\s+(\d{1,18})")
_RANK = re.compile(r"^#\s*Rank\s+(\d{1,18})\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\b")
_NNODES = re.compile(r"\bnNodes (\d{1,18})")
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d{1,18})\s+(OK|FAILED)")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)")
_CONCLUDED = re.compile(r"^#\s*Collective test concluded")
_PLATFORM = re.compile(r"(Running on (\S{1,64}) platform|not available for platform\s*:\s*([\w.-]{1,64}))")

# What follows is the rest of the line: taken with _rest, not with a pattern ending in `.*?\s*$`.
_USING = re.compile(r"\bUsing network ")
_ASSIGNED = re.compile(r"\bAssigned NET plugin (\S{1,64}) to comm")
_VIA = re.compile(r"\bvia NET/([^/\n]{1,64})/\d+")
_PROVIDER = re.compile(
    r"NET/OFI Selected [Pp]rovider is ([^,\s(]+)(?:,\s*fabric is ([^,\s(]+))?(?:\s*\(found (\d{1,18}) nics?\))?"
)
_PLUGIN = re.compile(r"NET/OFI (?:Initializing|Using) aws-ofi-nccl (\S+)")
_LIBFABRIC = re.compile(r"NET/OFI Using Libfabric version (\S+)")
_FILTER = re.compile(r"NET/OFI Setting provider_filter to (\S+)")
# aws-ofi-nccl failing: each wording seen in the shared logs and the plugin's releases (1.1: "Only EFA provider
# is supported"; 1.1x: fi_getinfo / protocol / "initialization failed"; 1.16: "No eligible providers"). The
# finding runs from the match to the end of the line; "NET/OFI ... initialization failed" is _INIT_FAILED after
# the first "NET/OFI ".
_FAILURE = re.compile(
    r"NET/OFI (?:No eligible providers were found|Initializing plugin failed|Unable to find a protocol that worked"
    r"|Failed to initialize \S{1,64} protocol|OFI fi_getinfo\(\) call failed|Only EFA provider is supported)"
    r"|Failed to initialize any NET plugin"
)
_NET_OFI = "NET/OFI "
_INIT_FAILED = re.compile(r"\binitialization failed")
# NCCL not finding or not loading the net plugin, NCCL 2.4 to 2.29 (src/plugin/plugin_open.cc and its ancestors):
# (a start, and where the finding ends: a pattern searched after the start, or None for the end of the line).
_PLUGIN_AT = r"NET/Plugin ?: ?"
_MISSING: tuple[tuple[re.Pattern[str], re.Pattern[str] | None], ...] = (
    (re.compile(_PLUGIN_AT + r"dlerror="), re.compile(r"No plugin found \([^)]{0,256}\)")),
    (re.compile(_PLUGIN_AT + r"No plugin found \([^)]{0,256}\)"), re.compile("")),
    (re.compile(_PLUGIN_AT + r"Could not find: ?"), re.compile(r"\. Using internal net plugin")),
    (re.compile(_PLUGIN_AT + r"Could not find: ?\S"), None),  # NCCL 2.28: the line ends at the file's name
    (re.compile(_PLUGIN_AT + r"Plugin load returned \d+ ?: ?"), None),
    (re.compile(_PLUGIN_AT + r"\S{1,256}: (?:cannot open shared object file|undefined symbol)"), None),
    (re.compile(r"Failed to open \S{0,256}libnccl-net\S{0,256}"), re.compile("")),
)
_NET_WARN = re.compile(r"NCCL WARN NET/\S")
# The longest finding kept from a line (a JSON export can be one line of megabytes).
_KEEP = 300


def _strip_prefix(line: str) -> str:
    m = _PREFIX.match(line)
    return line[m.end() :] if m else line


def _clip(text: str) -> str:
    """`text` kept to _KEEP characters, saying how much was left out."""
    return text if len(text) <= _KEEP else f"{text[:_KEEP]}... ({len(text) - _KEEP} more characters)"


def _rest(line: str, start: int, *, dot: bool = False) -> str:
    """The line from `start` to its end, without trailing spaces (and one trailing '.' when `dot`), clipped."""
    text = line[start:].rstrip()
    if dot and text.endswith("."):
        text = text[:-1]
    return _clip(text.strip())


def _failure(line: str) -> str | None:
    """aws-ofi-nccl's words for failing, from where they start to the end of the line; None when absent."""
    starts = []
    if m := _FAILURE.search(line):
        starts.append(m.start())
    first = line.find(_NET_OFI)
    if first >= 0 and _INIT_FAILED.search(line, first + len(_NET_OFI)):
        starts.append(first)
    return _rest(line, min(starts), dot=True) if starts else None


def _missing(line: str) -> str | None:
    """NCCL's words for not finding or not loading the net plugin; None when absent."""
    for start, end in _MISSING:
        if m := start.search(line):
            if end is None:
                return _rest(line, m.start())
            if e := end.search(line, m.end()):
                return _clip(line[m.start() : e.end()].strip())
            # No end after the first start, so none after a later one: the next wording.
    return None


def _header(content: str) -> tuple[str, ...] | None:
    """The column names of a result table header (`#  size  count  type ...`), None for any other line."""
    s = content.strip()
    if not s.startswith("#"):
        return None
    cols = tuple(s[1:].split())
    if len(cols) >= 8 and cols[:2] == ("size", "count") and cols.count("time") == 2 and "busbw" in cols:
        return cols
    return None


def _count(text: str) -> int:
    """A count nccl-tests printed with %g ('0', '12', '6.71089e+07'); ValueError unless a whole number >= 0."""
    value = float(text)
    if not math.isfinite(value) or value < 0 or not value.is_integer():
        raise ValueError(f"not a count: {text!r}")
    return int(value)


def _measurement(names: tuple[str, ...], values: list[str]) -> Measurement:
    d = dict(zip(names, values, strict=True))
    wrong = d.get("#wrong")
    error = d.get("error")
    return Measurement(
        time_us=float(d["time"]),
        algbw=float(d["algbw"]),
        busbw=float(d["busbw"]),
        wrong=None if wrong in (None, "N/A") else _count(wrong),
        error=None if error in (None, "N/A") else float(error),
    )


def _looks_like_row(content: str) -> bool:
    """A line that starts with a size, as every result row does (NCCL INFO lines start with a host name)."""
    first = content.split(None, 1)[:1]
    return bool(first) and first[0].isdigit()


def _row(content: str, cols: tuple[str, ...]) -> Row | None:
    """A result row under header `cols`, None when the line cannot be read as one."""
    values = content.split()
    if len(values) != len(cols) or not values[0].isdigit():
        return None
    t1 = cols.index("time")
    t2 = cols.index("time", t1 + 1)
    pre = dict(zip(cols[:t1], values[:t1], strict=True))
    try:
        return Row(
            size=int(pre["size"]),
            count=int(pre["count"]),
            type=pre.get("type", ""),
            redop=pre.get("redop", ""),
            root=int(pre["root"]) if "root" in pre else None,
            out_of_place=_measurement(cols[t1:t2], values[t1:t2]),
            in_place=_measurement(cols[t2:], values[t2:]),
        )
    except (KeyError, ValueError):
        return None


def _nccl_from_code(code: int) -> str:
    """NCCL_VERSION_CODE to X.Y.Z: X*10000 + Y*100 + Z since 2.9, X*1000 + Y*100 + Z before."""
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def _instance_type(platform: str) -> str | None:
    if "." in platform:
        return platform
    # aws-ofi-nccl 1.1 printed "Running on P4d platform" only when the DMI product name is exactly p4d.24xlarge.
    return "p4d.24xlarge" if platform.lower() == "p4d" else None


def distinct(items: Iterable[str]) -> tuple[str, ...]:
    """The items without repeats, first seen first."""
    return tuple(dict.fromkeys(items))


class _TableBuilder:
    def __init__(self, cols: tuple[str, ...], collective: str | None, limits: tuple[int, int] | None) -> None:
        self.cols = cols
        self.collective = collective
        self.limits = limits
        self.rows: list[Row] = []
        self.unreadable: list[str] = []
        self.oob: tuple[int, bool] | None = None
        self.avg: float | None = None
        self.footer = False

    def build(self) -> ResultTable:
        return ResultTable(
            collective=self.collective,
            layout="wrong" if "#wrong" in self.cols else "error",
            rows=tuple(self.rows),
            unreadable=tuple(self.unreadable),
            out_of_bounds=self.oob[0] if self.oob else None,
            out_of_bounds_ok=self.oob[1] if self.oob else None,
            footer=self.footer,
            avg_busbw=self.avg,
            min_bytes=self.limits[0] if self.limits else None,
            max_bytes=self.limits[1] if self.limits else None,
        )


def parse(text: str) -> ParsedLog:
    """Everything `judge` needs from an nccl-tests (or any NCCL_DEBUG=INFO) log. Never fails: what the log does
    not say stays empty, and the verdict says so."""
    versions: list[str] = []
    cudas: list[str] = []
    tests_version: str | None = None
    instance_types: list[str] = []
    instance_evidence: str | None = None
    ranks: dict[int, str] = {}
    nnodes: int | None = None
    used: list[str] = []
    providers: list[tuple[str, str | None]] = []
    nics: list[int] = []
    plugin: str | None = None
    libfabric: str | None = None
    provider_filter: str | None = None
    failures: list[str] = []
    missing: list[str] = []
    warnings: list[str] = []
    tables: list[ResultTable] = []
    current: _TableBuilder | None = None
    collective: str | None = None
    limits: tuple[int, int] | None = None

    def close() -> None:
        nonlocal current
        if current is not None:
            tables.append(current.build())
            current = None

    for number, raw in enumerate(text.splitlines(), 1):
        line = _strip_prefix(raw)
        stripped = line.strip()
        if not stripped:
            continue

        # The result table first: its rows are most of a log.
        cols = _header(line)
        if cols is not None:
            close()
            current = _TableBuilder(cols, collective, limits)
            limits = None
            continue
        if current is not None:
            if _looks_like_row(stripped):
                row = _row(line, current.cols)
                if row is not None:
                    current.rows.append(row)
                else:
                    current.unreadable.append(f"line {number}: {_clip(stripped)}")
                continue
            if m := _OOB.match(stripped):
                current.oob = (int(m.group(1)), m.group(2) == "OK")
                continue
            if m := _AVG.match(stripped):
                try:
                    current.avg = float(m.group(1))
                except ValueError:
                    current.avg = None
                current.footer = True
                close()
                continue
            if _CONCLUDED.match(stripped):
                current.footer = True
                close()
                continue

        if m := _TEST_HEADER.search(stripped):
            limits = (int(m.group(1)), int(m.group(2)))
        if m := _COLLECTIVE.search(stripped):
            collective = m.group(1)
        if m := _RANK.match(stripped):
            ranks[int(m.group(1))] = _clip(m.group(2))
            continue
        if m := _NCCL_VERSION.search(stripped):
            versions.append(m.group(1))
            if m.group(2):
                cudas.append(m.group(2))
        if m := _TESTS_VERSION.search(stripped):
            tests_version = _clip(m.group(1))
            if library := _LIBRARY.search(stripped, m.end()):
                versions.append(_nccl_from_code(int(library.group(1))))
        if m := _NNODES.search(stripped):
            nnodes = max(nnodes or 0, int(m.group(1)))
        if m := _PLATFORM.search(stripped):
            found = _instance_type(m.group(2) or m.group(3))
            if found:
                instance_types.append(found)
                instance_evidence = instance_evidence or m.group(1)

        if "net" not in stripped.lower():  # NET/OFI, NET/Plugin, NET/Socket, 'Using network', libnccl-net
            continue
        if (m := _USING.search(stripped)) and (name := _rest(stripped, m.end())):
            used.append(name)
        for pattern in (_ASSIGNED, _VIA):
            if m := pattern.search(stripped):
                used.append(_clip(m.group(1)))
        if m := _PROVIDER.search(stripped):
            providers.append((_clip(m.group(1)), _clip(m.group(2)) if m.group(2) else None))
            if m.group(3):
                nics.append(int(m.group(3)))
        if m := _PLUGIN.search(stripped):
            plugin = plugin or _clip(m.group(1))
        if m := _LIBFABRIC.search(stripped):
            libfabric = libfabric or _clip(m.group(1))
        if m := _FILTER.search(stripped):
            provider_filter = provider_filter or _clip(m.group(1))
        if failure := _failure(stripped):
            failures.append(failure)
            continue
        if absent := _missing(stripped):
            missing.append(absent)
        elif m := _NET_WARN.search(stripped):
            warnings.append(_rest(stripped, m.start() + len("NCCL WARN ")))
    close()

    return ParsedLog(
        nccl_versions=distinct(versions),
        cuda_versions=distinct(cudas),
        nccl_tests_version=tests_version,
        instance_types=distinct(instance_types),
        instance_type_evidence=instance_evidence,
        hosts=distinct(ranks[r] for r in sorted(ranks)),
        ranks=len(ranks) or None,
        nnodes=nnodes,
        network=Network(
            used=distinct(used),
            providers=distinct(p for p, _ in providers),
            fabric=next((f for _, f in providers if f), None),
            nics=tuple(sorted(set(nics))),
            plugin_version=plugin,
            libfabric=libfabric,
            provider_filter=provider_filter,
            failures=distinct(failures),
            missing=distinct(missing),
            warnings=distinct(w for w in warnings if w not in failures),
        ),
        tables=tuple(tables),
    )
