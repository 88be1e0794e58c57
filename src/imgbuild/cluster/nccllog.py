"""Read an nccl-tests log (or any NCCL_DEBUG=INFO log) into typed data: `parse(text)` -> `ParsedLog`.

A pure function, no I/O, that never fails: what a log does not say stays empty. report.py judges what it finds.

What the parser understands, from the logs in tests/data/upstream/nccl-tests:
- line prefixes: Open MPI's `--tag-output` (`[1,0]<stdout>:`) and `srun -l` (`0: `), also indented;
- both result tables: nccl-tests before 2.13 (`redop`, then `time algbw busbw error` twice) and since
  (`redop root`, then `time algbw busbw #wrong` twice); out-of-place first, in-place second; NCCL INFO lines
  interleaved with the rows; `# Out of bounds values : N OK|FAILED`; `# Avg bus bandwidth : X`;
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
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Frozen(BaseModel):
    """The base of a log's models and of its verdict's: immutable, unknown fields refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Measurement(Frozen):
    """One half of a result row (out-of-place or in-place)."""

    time_us: float
    algbw: float
    busbw: float
    wrong: int | None = Field(None, description="'#wrong' (nccl-tests 2.13+); null: old table, or N/A (-c 0)")
    error: float | None = Field(None, description="'error' of older nccl-tests (max relative error); null if N/A")


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
        """The lower of the two bus bandwidths: what a run is judged by."""
        return min(self.out_of_place.busbw, self.in_place.busbw)


class ResultTable(Frozen):
    """One nccl-tests result table and its footer."""

    collective: str | None = Field(description="e.g. all_reduce_perf; null when the log does not name it")
    layout: Literal["wrong", "error"] = Field(description="'wrong': nccl-tests 2.13+; 'error': older")
    rows: tuple[Row, ...]
    out_of_bounds: int | None = None
    out_of_bounds_ok: bool | None = None
    avg_busbw: float | None = Field(None, description="'Avg bus bandwidth': a mean over the sizes run, not a verdict")
    min_bytes: int | None = None
    max_bytes: int | None = None

    def at(self, size: int) -> Row | None:
        found = [r for r in self.rows if r.size == size]
        return found[-1] if found else None

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
_TESTS_VERSION = re.compile(r"nccl-tests version (\S+)(?:.*?\bnccl-library=(\d+))?")
_COLLECTIVE = re.compile(
    r"\b((?:all_reduce|all_gather|alltoall|broadcast|reduce_scatter|reduce|gather|scatter|sendrecv|hypercube)_perf)"
)
_TEST_HEADER = re.compile(r"#\s*nThread\s+\d+\s+nGpus\s+\d+\s+minBytes\s+(\d+)\s+maxBytes\s+(\d+)")
_RANK = re.compile(r"^#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\b")
_NNODES = re.compile(r"\bnNodes (\d+)")
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s+(OK|FAILED)")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)")
_CONCLUDED = re.compile(r"^#\s*Collective test concluded")
_PLATFORM = re.compile(r"(Running on (\S+) platform|not available for platform\s*:\s*([\w.-]+))")

_USING = re.compile(r"\bUsing network (.+?)\s*$")
_ASSIGNED = re.compile(r"\bAssigned NET plugin (\S+) to comm")
_VIA = re.compile(r"\bvia NET/([^/]+)/\d+")
_PROVIDER = re.compile(
    r"NET/OFI Selected [Pp]rovider is ([^,\s(]+)(?:,\s*fabric is ([^,\s(]+))?(?:\s*\(found (\d+) nics?\))?"
)
_PLUGIN = re.compile(r"NET/OFI (?:Initializing|Using) aws-ofi-nccl (\S+)")
_LIBFABRIC = re.compile(r"NET/OFI Using Libfabric version (\S+)")
_FILTER = re.compile(r"NET/OFI Setting provider_filter to (\S+)")
# aws-ofi-nccl failing: each wording seen in the shared logs and the plugin's releases (1.1: "Only EFA provider
# is supported"; 1.1x: fi_getinfo / protocol / "initialization failed"; 1.16: "No eligible providers").
_FAILURE = re.compile(
    r"(NET/OFI (?:No eligible providers were found|.*\binitialization failed|Initializing plugin failed"
    r"|Unable to find a protocol that worked|Failed to initialize \S+ protocol|OFI fi_getinfo\(\) call failed"
    r"|Only EFA provider is supported).*?|Failed to initialize any NET plugin)\.?\s*$"
)
# NCCL not finding or not loading the net plugin, NCCL 2.4 to 2.29 (src/plugin/plugin_open.cc and its ancestors).
_MISSING = (
    re.compile(r"NET/Plugin ?: ?dlerror=.*?No plugin found \([^)]*\)"),
    re.compile(r"NET/Plugin ?: ?No plugin found \([^)]*\)"),
    re.compile(r"NET/Plugin ?: ?Could not find: ?.*?\. Using internal net plugin"),
    re.compile(r"NET/Plugin ?: ?Plugin load returned \d+ ?: ?.*?\.?\s*$"),
    re.compile(r"NET/Plugin ?: ?\S+: (?:cannot open shared object file|undefined symbol).*?\s*$"),
    re.compile(r"Failed to open \S*libnccl-net\S*"),
)
_NET_WARN = re.compile(r"NCCL WARN (NET/\S.*?)\s*$")


def _strip_prefix(line: str) -> str:
    m = _PREFIX.match(line)
    return line[m.end() :] if m else line


def _header(content: str) -> tuple[str, ...] | None:
    """The column names of a result table header (`#  size  count  type ...`), None for any other line."""
    s = content.strip()
    if not s.startswith("#"):
        return None
    cols = tuple(s[1:].split())
    if len(cols) >= 8 and cols[:2] == ("size", "count") and cols.count("time") == 2 and "busbw" in cols:
        return cols
    return None


def _measurement(names: tuple[str, ...], values: list[str]) -> Measurement:
    d = dict(zip(names, values, strict=True))
    wrong = d.get("#wrong")
    error = d.get("error")
    return Measurement(
        time_us=float(d["time"]),
        algbw=float(d["algbw"]),
        busbw=float(d["busbw"]),
        wrong=None if wrong in (None, "N/A") else int(wrong),
        error=None if error in (None, "N/A") else float(error),
    )


def _row(content: str, cols: tuple[str, ...]) -> Row | None:
    """A result row under header `cols`, None when the line is something else (NCCL INFO, '...', a comment)."""
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
        self.oob: tuple[int, bool] | None = None
        self.avg: float | None = None

    def build(self) -> ResultTable:
        return ResultTable(
            collective=self.collective,
            layout="wrong" if "#wrong" in self.cols else "error",
            rows=tuple(self.rows),
            out_of_bounds=self.oob[0] if self.oob else None,
            out_of_bounds_ok=self.oob[1] if self.oob else None,
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

    for raw in text.splitlines():
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
            row = _row(line, current.cols)
            if row is not None:
                current.rows.append(row)
                continue
            if m := _OOB.match(stripped):
                current.oob = (int(m.group(1)), m.group(2) == "OK")
                continue
            if m := _AVG.match(stripped):
                try:
                    current.avg = float(m.group(1))
                except ValueError:
                    current.avg = None
                close()
                continue
            if _CONCLUDED.match(stripped):
                close()
                continue

        if m := _TEST_HEADER.search(stripped):
            limits = (int(m.group(1)), int(m.group(2)))
        if m := _COLLECTIVE.search(stripped):
            collective = m.group(1)
        if m := _RANK.match(stripped):
            ranks[int(m.group(1))] = m.group(2)
            continue
        if m := _NCCL_VERSION.search(stripped):
            versions.append(m.group(1))
            if m.group(2):
                cudas.append(m.group(2))
        if m := _TESTS_VERSION.search(stripped):
            tests_version = m.group(1)
            if m.group(2):
                versions.append(_nccl_from_code(int(m.group(2))))
        if m := _NNODES.search(stripped):
            nnodes = max(nnodes or 0, int(m.group(1)))
        if m := _PLATFORM.search(stripped):
            found = _instance_type(m.group(2) or m.group(3))
            if found:
                instance_types.append(found)
                instance_evidence = instance_evidence or m.group(1)

        if "net" not in stripped.lower():  # NET/OFI, NET/Plugin, NET/Socket, 'Using network', libnccl-net
            continue
        for pattern in (_USING, _ASSIGNED, _VIA):
            if m := pattern.search(stripped):
                used.append(m.group(1))
        if m := _PROVIDER.search(stripped):
            providers.append((m.group(1), m.group(2)))
            if m.group(3):
                nics.append(int(m.group(3)))
        if m := _PLUGIN.search(stripped):
            plugin = plugin or m.group(1)
        if m := _LIBFABRIC.search(stripped):
            libfabric = libfabric or m.group(1)
        if m := _FILTER.search(stripped):
            provider_filter = provider_filter or m.group(1)
        if m := _FAILURE.search(stripped):
            failures.append(m.group(1))
            continue
        for pattern in _MISSING:
            if m := pattern.search(stripped):
                missing.append(m.group(0).strip())
                break
        else:
            if m := _NET_WARN.search(stripped):
                warnings.append(m.group(1))
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
