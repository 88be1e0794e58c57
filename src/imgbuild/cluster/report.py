"""Read an nccl-tests log and judge the run: the network NCCL used, its version, correct results, bus bandwidth.

Pure functions, no I/O: `parse(text)` -> `ParsedLog`, `judge(log, expect)` -> `Report`, `junit_xml(report)` -> str.
cli.py reads the log and writes the outputs; plot.py draws.

What the parser understands, from the logs in ../shared/data/nccl-tests:
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
from typing import TYPE_CHECKING, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from imgbuild.cluster import expected

if TYPE_CHECKING:
    from imgbuild.resolver import Resolved

T = TypeVar("T", str, int)
Status = Literal["PASS", "WARN", "FAIL", "SKIP"]
Verdict = Literal["PASS", "WARN", "FAIL"]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# ---------------------------------------------------------------------------------------------------------------
# What a log says


class Measurement(_Model):
    """One half of a result row (out-of-place or in-place)."""

    time_us: float
    algbw: float
    busbw: float
    wrong: int | None = Field(None, description="'#wrong' (nccl-tests 2.13+); null: old table, or N/A (-c 0)")
    error: float | None = Field(None, description="'error' of older nccl-tests (max relative error); null if N/A")


class Row(_Model):
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


class ResultTable(_Model):
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


class Network(_Model):
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


class ParsedLog(_Model):
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


def _distinct(items: Iterable[str]) -> tuple[str, ...]:
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
        nccl_versions=_distinct(versions),
        cuda_versions=_distinct(cudas),
        nccl_tests_version=tests_version,
        instance_types=_distinct(instance_types),
        instance_type_evidence=instance_evidence,
        hosts=_distinct(ranks[r] for r in sorted(ranks)),
        ranks=len(ranks) or None,
        nnodes=nnodes,
        network=Network(
            used=_distinct(used),
            providers=_distinct(p for p, _ in providers),
            fabric=next((f for _, f in providers if f), None),
            nics=tuple(sorted(set(nics))),
            plugin_version=plugin,
            libfabric=libfabric,
            provider_filter=provider_filter,
            failures=_distinct(failures),
            missing=_distinct(missing),
            warnings=_distinct(w for w in warnings if w not in failures),
        ),
        tables=tuple(tables),
    )


# ---------------------------------------------------------------------------------------------------------------
# The verdict


class Expect(_Model):
    """What the run should show. Every field is optional: what is not given is not judged (and the report says so),
    except the instance type and node count, which the log itself may give."""

    instance_type: str | None = Field(None, pattern=r"^[a-z][a-z0-9-]*\.[a-z0-9]+$")
    nodes: int | None = Field(None, ge=1)
    nccl_version: str | None = Field(None, pattern=r"^\d+\.\d+\.\d+$")
    aws_ofi_nccl_version: str | None = Field(None, pattern=r"^\d+\.\d+\.\d+\S*$")

    @classmethod
    def from_resolved(cls, resolved: Resolved, *, instance_type: str | None = None, nodes: int | None = None) -> Expect:
        """The expectations of an image built from `resolved` (a recipe's lock): its NCCL and aws-ofi-nccl pins,
        and its instance type when the recipe names exactly one (an explicit `instance_type` wins)."""
        types = resolved.recipe.platform.instance_types
        return cls(
            instance_type=instance_type or (types[0] if len(types) == 1 else None),
            nodes=nodes,
            nccl_version=resolved.version("nccl"),
            aws_ofi_nccl_version=resolved.version("aws_ofi_nccl"),
        )


class Criterion(_Model):
    """One line of the verdict; one JUnit testcase."""

    name: str
    status: Status
    expected: str = ""
    found: str = ""
    reason: str = ""


class BandwidthCheck(_Model):
    """A published figure against this run's row at the same size (for the JSON and the plot)."""

    size: int
    published: float
    floor: float = Field(description="published x (1 - tolerance): the least that passes")
    out_of_place: float | None
    in_place: float | None
    status: Status
    figure: expected.Figure


class Report(_Model):
    source: str
    verdict: Verdict
    criteria: tuple[Criterion, ...]
    instance_type: str | None
    instance_type_from: str = Field(description="'log: <the line>', 'option', or 'unknown'")
    nodes: int | None
    nodes_from: str
    tolerance: float
    bandwidth: tuple[BandwidthCheck, ...]
    notes: tuple[str, ...]
    log: ParsedLog

    @property
    def failed(self) -> tuple[Criterion, ...]:
        return tuple(c for c in self.criteria if c.status == "FAIL")

    def counts(self) -> dict[str, int]:
        return {s: sum(1 for c in self.criteria if c.status == s) for s in ("PASS", "WARN", "FAIL", "SKIP")}


_EFA_WANTED = "EFA through aws-ofi-nccl (libfabric provider efa)"


def human_size(n: int) -> str:
    """1073741824 -> '1 GiB'; 3145728 -> '3 MiB'; 1000 -> '1000 B'."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or not value.is_integer() or value % 1024:
            return f"{value:g} {unit}"
        value /= 1024
    return f"{value:g} TiB"


def _version_key(v: str) -> str:
    """'1.13.2-aws' -> '1.13.2', '1.5.0aws' -> '1.5.0'."""
    m = re.match(r"\d+\.\d+\.\d+", v)
    return m.group(0) if m else v


def _is_libfabric(name: str) -> bool:
    return "libfabric" in name.lower() or name.lower().startswith("ofi")


def _network(net: Network) -> Criterion:
    parts: list[str] = []
    if net.used:
        parts.append("network " + ", ".join(net.used))
    if net.providers:
        parts.append(f"provider {', '.join(net.providers)}" + (f", fabric {net.fabric}" if net.fabric else ""))
    if net.nics:
        n = f"{net.nics[0]}-{net.nics[-1]}" if len(net.nics) > 1 else str(net.nics[0])
        parts.append(f"{n} NIC" + ("" if n == "1" else "s"))
    if net.plugin_version:
        parts.append(f"aws-ofi-nccl {net.plugin_version}")
    if net.libfabric:
        parts.append(f"libfabric {net.libfabric}")
    found = ", ".join(parts) or "no NCCL network lines"

    def crit(status: Status, reason: str) -> Criterion:
        return Criterion(name="network", status=status, expected=_EFA_WANTED, found=found, reason=reason)

    libfabric = [u for u in net.used if _is_libfabric(u)]
    other = [u for u in net.used if not _is_libfabric(u)]
    fallback = f"; NCCL fell back to {', '.join(other)}" if other else ""
    plugin = f"aws-ofi-nccl {net.plugin_version}" if net.plugin_version else "aws-ofi-nccl"
    if net.failures:
        return crit("FAIL", f"{plugin} failed to initialize: {'; '.join(net.failures[:4])}{fallback}")
    if net.missing:
        return crit("FAIL", f"NCCL did not load the EFA net plugin: {'; '.join(net.missing[:2])}{fallback}")
    if other:
        if libfabric:
            return crit("FAIL", f"ranks disagree: some used {', '.join(libfabric)}, others {', '.join(other)}")
        why = (
            f"{plugin} loaded, yet NCCL used {', '.join(other)} (is NCCL_NET set?)"
            if net.plugin_version
            else f"NCCL used {', '.join(other)}, not EFA: the log has no aws-ofi-nccl line, so the plugin was not "
            "loaded (not in the image, not on LD_LIBRARY_PATH, or NCCL_NET_PLUGIN names another)"
        )
        return crit("FAIL", why)
    # A provider may print with its utility layer ("efa;ofi_rxr"): the first name is the fabric's.
    providers = [p.split(";")[0] for p in net.providers]
    if providers and any(p != "efa" for p in providers):
        return crit("FAIL", f"libfabric provider {', '.join(net.providers)}, not efa: the traffic did not go over EFA")
    if libfabric:
        if not providers:
            return crit("WARN", f"NCCL used {libfabric[0]}, but the log does not say which libfabric provider")
        if net.warnings:
            return crit("WARN", f"EFA used, with plugin warnings: {'; '.join(net.warnings[:3])}")
        return crit("PASS", f"NCCL used {libfabric[0]} with provider efa")
    if providers:
        return crit("PASS", "aws-ofi-nccl selected provider efa (the log has no 'Using network' line)")
    if net.plugin_version or net.provider_filter:
        return crit(
            "WARN",
            f"{plugin} started, but the log ends (or was cut) before NCCL said which network it used: EFA not proven",
        )
    return crit(
        "WARN",
        "the log names no network (no NCCL INFO lines): run with NCCL_DEBUG=INFO to prove EFA was used",
    )


def _nccl_version(found: tuple[str, ...], wanted: str | None) -> Criterion:
    shown = ", ".join(found) or "not in the log"
    base = {"name": "NCCL version", "expected": wanted or "", "found": shown}
    if len(found) > 1:
        return Criterion(**base, status="FAIL", reason=f"the ranks loaded different NCCL versions: {shown}")
    if wanted is None:
        return Criterion(**base, status="SKIP", reason="no expected version given (--nccl-version, or the lock)")
    if not found:
        return Criterion(**base, status="WARN", reason="the log does not print NCCL's version (NCCL_DEBUG=INFO does)")
    if found[0] != wanted:
        return Criterion(
            **base,
            status="FAIL",
            reason=f"the job loaded NCCL {found[0]}, not the image's {wanted}: another libnccl came first "
            "(LD_LIBRARY_PATH, or PyTorch's own wheel), or the job ran another image",
        )
    return Criterion(**base, status="PASS", reason="the NCCL the image pins")


def _plugin_version(found: str | None, wanted: str | None) -> Criterion | None:
    if found is None and wanted is None:
        return None
    base = {"name": "aws-ofi-nccl version", "expected": wanted or "", "found": found or "not in the log"}
    if wanted is None:
        return Criterion(**base, status="SKIP", reason="no expected version given (the lock has it)")
    if found is None:
        return Criterion(**base, status="WARN", reason="the log does not print the plugin's version")
    if _version_key(found) != _version_key(wanted):
        return Criterion(**base, status="FAIL", reason=f"the job loaded aws-ofi-nccl {found}, not the image's {wanted}")
    return Criterion(**base, status="PASS", reason="the plugin the image pins")


def _pick(what: str, from_log: T | None, given: T | None, evidence: str) -> tuple[T | None, str, Criterion | None]:
    """The value to judge by: the log's when it says (an option that differs gets a WARN), else the option."""
    if from_log is None:
        return given, "option" if given is not None else "unknown", None
    crit = None
    if given is not None and given != from_log:
        crit = Criterion(
            name=what,
            status="WARN",
            expected=str(given),
            found=str(from_log),
            reason=f"the option says {given}, the log {from_log} ({evidence}); judged as {from_log}",
        )
    return from_log, f"log: {evidence}", crit


def _results(tables: tuple[ResultTable, ...]) -> list[Criterion]:
    if not tables:
        return [
            Criterion(
                name="results",
                status="FAIL",
                expected="an nccl-tests result table with #wrong 0",
                found="no result table",
                reason="no nccl-tests result table in the log: the run stopped before measuring, or "
                "this is not nccl-tests output",
            )
        ]
    out = []
    for k, t in enumerate(tables, 1):
        name = "results" if len(tables) == 1 else f"results (table {k}{', ' + t.collective if t.collective else ''})"
        expected_text = "#wrong 0 and 'Out of bounds values : 0 OK'"
        oob = (
            f"out of bounds {t.out_of_bounds} {'OK' if t.out_of_bounds_ok else 'FAILED'}"
            if t.out_of_bounds is not None
            else "no 'Out of bounds' line"
        )

        def crit(status: Status, found: str, reason: str, name: str = name, exp: str = expected_text) -> Criterion:
            return Criterion(name=name, status=status, expected=exp, found=found, reason=reason)

        if not t.rows:
            out.append(crit("FAIL", "a header and no rows", "the run stopped before its first result"))
            continue
        bad = [
            f"{human_size(r.size)} ({r.out_of_place.wrong or 0} out-of-place, {r.in_place.wrong or 0} in-place)"
            for r in t.rows
            if (r.out_of_place.wrong or 0) + (r.in_place.wrong or 0) > 0
        ]
        if bad:
            out.append(
                crit(
                    "FAIL",
                    f"#wrong > 0 at {len(bad)} sizes; {oob}",
                    f"wrong results at {', '.join(bad[:4])}{' ...' if len(bad) > 4 else ''}: data "
                    "corruption on the path (GPU, NIC or driver), not a slow network",
                )
            )
            continue
        if t.out_of_bounds is not None and (t.out_of_bounds > 0 or not t.out_of_bounds_ok):
            out.append(crit("FAIL", oob, f"nccl-tests counted {t.out_of_bounds} out-of-bounds values"))
            continue
        checked = [r for r in t.rows if r.out_of_place.wrong is not None or r.in_place.wrong is not None]
        if t.layout == "wrong" and not checked:
            out.append(crit("WARN", f"#wrong N/A; {oob}", "validation was off (-c 0): results not checked"))
        elif t.layout == "error" and t.out_of_bounds is None:
            out.append(
                crit(
                    "WARN",
                    "old table (error column), no 'Out of bounds' line",
                    "this nccl-tests prints no #wrong, and the log lacks its out-of-bounds count",
                )
            )
        elif t.layout == "error":
            worst = max((r.out_of_place.error or 0.0, r.in_place.error or 0.0) for r in t.rows)
            out.append(
                crit("PASS", f"{oob}; max error {max(worst):g}", f"{len(t.rows)} sizes, no out-of-bounds values")
            )
        else:
            out.append(crit("PASS", f"#wrong 0 at {len(t.rows)} sizes; {oob}", "every size validated"))
    return out


def _bandwidth(
    log: ParsedLog, figures_table: expected.Table, instance_type: str | None, nodes: int | None
) -> tuple[list[Criterion], list[BandwidthCheck]]:
    measured = [t for t in log.tables if t.rows]
    if not measured:
        return [Criterion(name="bandwidth", status="SKIP", reason="no results to judge")], []
    wanted = figures_table.collective
    tables = [t for t in measured if t.collective in (None, wanted)]

    def not_judged(reason: str, found: str = "") -> tuple[list[Criterion], list[BandwidthCheck]]:
        return [Criterion(name="bandwidth", status="WARN", found=found, reason=f"not judged: {reason}")], []

    if not tables:
        ran = ", ".join(_distinct(t.collective or "" for t in measured))
        return not_judged(f"the published figures are {wanted}'s, this log ran {ran}")
    if instance_type is None:
        return not_judged(
            "the instance type is unknown: the log does not name it (aws-ofi-nccl prints it only for "
            "some instance types) and no --instance-type was given"
        )
    if nodes is None:
        return not_judged("the node count is unknown: the log lists no ranks' hosts, and no --nodes was given")
    figures = figures_table.for_run(instance_type, nodes)
    if not figures:
        counts = figures_table.node_counts(instance_type)
        if not counts:
            return not_judged(
                f"no published figure for {instance_type} (the table has {', '.join(figures_table.instance_types())})"
            )
        return not_judged(
            f"the figures published for {instance_type} are for "
            f"{' or '.join(str(c) for c in counts)} nodes; this run had {nodes}"
        )
    gpn = log.gpus_per_node
    if gpn is not None and gpn != figures[0].gpus_per_node:
        return not_judged(
            f"the figures for {nodes}x {instance_type} are with {figures[0].gpus_per_node} GPUs per "
            f"node; this run had {gpn} ranks per node"
        )

    tol = figures_table.tolerance
    ran_nccl = log.nccl_versions[0] if len(log.nccl_versions) == 1 else None
    criteria: list[Criterion] = []
    checks: list[BandwidthCheck] = []
    for k, t in enumerate(tables, 1):
        suffix = "" if len(tables) == 1 else f" (table {k})"
        top = max(r.size for r in t.rows)
        for fig in figures:
            name = f"bandwidth {human_size(fig.size)}{suffix}"
            floor = round(fig.busbw * (1 - tol), 2)
            published = f"{fig.busbw:g} GB/s published for {nodes}x {instance_type} (NCCL {fig.nccl or 'not stated'})"
            exp_text = f">= {floor:g} GB/s ({fig.busbw:g} - {tol:.0%})"
            row = t.at(fig.size)
            if row is None:
                criteria.append(
                    Criterion(
                        name=name,
                        status="SKIP",
                        expected=exp_text,
                        found="not measured",
                        reason=f"this run stops at {human_size(top)}",
                    )
                )
                checks.append(
                    BandwidthCheck(
                        size=fig.size,
                        published=fig.busbw,
                        floor=floor,
                        out_of_place=None,
                        in_place=None,
                        status="SKIP",
                        figure=fig,
                    )
                )
                continue
            got = row.busbw
            found = f"{row.out_of_place.busbw:g} out-of-place, {row.in_place.busbw:g} in-place"
            if got >= floor:
                status: Status = "PASS"
                reason = f"{got:g} GB/s is {got / fig.busbw:.0%} of the {published}"
            else:
                status = "FAIL"
                reason = f"{got:g} GB/s is {got / fig.busbw:.0%} of the {published}, below {1 - tol:.0%}"
                if ran_nccl and fig.nccl and _version_key(ran_nccl).split(".")[:2] != fig.nccl.split(".")[:2]:
                    reason += f"; this run used NCCL {ran_nccl}"
            criteria.append(Criterion(name=name, status=status, expected=exp_text, found=found, reason=reason))
            checks.append(
                BandwidthCheck(
                    size=fig.size,
                    published=fig.busbw,
                    floor=floor,
                    out_of_place=row.out_of_place.busbw,
                    in_place=row.in_place.busbw,
                    status=status,
                    figure=fig,
                )
            )
    if all(c.status == "SKIP" for c in criteria):
        tops = ", ".join(_distinct(human_size(max(r.size for r in t.rows)) for t in tables))
        sizes = ", ".join(human_size(f.size) for f in figures)
        return not_judged(f"the published figures are at {sizes}; this run stops at {tops}")[0], checks
    return criteria, checks


def _avg_notes(tables: tuple[ResultTable, ...]) -> list[str]:
    notes = []
    for t in tables:
        if t.avg_busbw is None:
            continue
        span = t.sizes
        over = f"from {human_size(span[0])} to {human_size(span[1])}" if span else "over the sizes run"
        notes.append(
            f"Avg bus bandwidth {t.avg_busbw:g} GB/s is the mean over every size measured ({over}): it moves with "
            "-b/-e and is small sizes' latency as much as bandwidth, so it is shown, not judged. The verdict "
            "compares the published sizes."
        )
    return notes


def judge(
    log: ParsedLog,
    expect: Expect | None = None,
    *,
    source: str = "-",
    figures: expected.Table | None = None,
) -> Report:
    """The verdict on a parsed log: FAIL when any criterion fails, else WARN when one could not be judged or
    looks off, else PASS. `figures` defaults to the shipped table of published bus bandwidth."""
    expect = expect or Expect()
    table = figures or expected.shipped()
    criteria: list[Criterion] = [_network(log.network), _nccl_version(log.nccl_versions, expect.nccl_version)]
    plugin = _plugin_version(log.network.plugin_version, expect.aws_ofi_nccl_version)
    if plugin:
        criteria.append(plugin)
    if len(log.instance_types) > 1:
        named = ", ".join(log.instance_types)
        criteria.append(
            Criterion(
                name="instance type",
                status="WARN",
                found=named,
                reason=f"the log names several instance types ({named}): judged as none",
            )
        )
        instance_type: str | None = None
        it_from = "unknown"
    else:
        from_log = log.instance_types[0] if log.instance_types else None
        instance_type, it_from, it_crit = _pick(
            "instance type", from_log, expect.instance_type, f"'{log.instance_type_evidence}'"
        )
        criteria += [it_crit] if it_crit else []
    nodes, nodes_from, nodes_crit = _pick(
        "nodes",
        log.nodes,
        expect.nodes,
        f"{len(log.hosts)} hosts in the Rank lines" if log.hosts else f"NCCL's nNodes {log.nnodes}",
    )
    criteria += [nodes_crit] if nodes_crit else []
    criteria += _results(log.tables)
    bw_criteria, checks = _bandwidth(log, table, instance_type, nodes)
    criteria += bw_criteria
    statuses = {c.status for c in criteria}
    verdict: Verdict = "FAIL" if "FAIL" in statuses else "WARN" if "WARN" in statuses else "PASS"
    return Report(
        source=source,
        verdict=verdict,
        criteria=tuple(criteria),
        instance_type=instance_type,
        instance_type_from=it_from,
        nodes=nodes,
        nodes_from=nodes_from,
        tolerance=table.tolerance,
        bandwidth=tuple(checks),
        notes=tuple(_avg_notes(log.tables)),
        log=log,
    )


def report(text: str, expect: Expect | None = None, *, source: str = "-") -> Report:
    """parse + judge."""
    return judge(parse(text), expect, source=source)


def junit_xml(rep: Report) -> str:
    """JUnit XML: one testcase per criterion; FAIL -> <failure>, WARN and SKIP -> <skipped> (WARN says so), PASS
    carries its evidence in <system-out>."""
    import xml.etree.ElementTree as ET

    counts = rep.counts()
    suites = ET.Element("testsuites", name="imgbuild cluster report")
    suite = ET.SubElement(
        suites,
        "testsuite",
        name=f"imgbuild cluster report {rep.source}",
        tests=str(len(rep.criteria)),
        failures=str(counts["FAIL"]),
        errors="0",
        skipped=str(counts["WARN"] + counts["SKIP"]),
        time="0",
    )
    props = ET.SubElement(suite, "properties")
    for key, value in (
        ("verdict", rep.verdict),
        ("instance_type", rep.instance_type or ""),
        ("nodes", "" if rep.nodes is None else str(rep.nodes)),
        ("nccl_version", ", ".join(rep.log.nccl_versions)),
        ("tolerance", str(rep.tolerance)),
    ):
        ET.SubElement(props, "property", name=key, value=value)
    for c in rep.criteria:
        case = ET.SubElement(suite, "testcase", classname="imgbuild.cluster.report", name=c.name, time="0")
        text = f"expected: {c.expected}\nfound: {c.found}\n{c.reason}".strip()
        if c.status == "FAIL":
            ET.SubElement(case, "failure", message=c.reason, type="ClusterReportFailure").text = text
        elif c.status in ("WARN", "SKIP"):
            ET.SubElement(case, "skipped", message=f"{c.status}: {c.reason}")
        else:
            ET.SubElement(case, "system-out").text = text
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def to_json(rep: Report) -> str:
    import json

    return json.dumps(rep.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"
