"""The criteria of an nccl-tests verdict, one line each (`Criterion`): the network NCCL used (`network_used`), a
one-node run's scope, the NCCL and plugin versions against the lock's, the result tables (repeated, complete,
readable), and the bus bandwidth against the published figures (`BandwidthCheck`); `verdict.judge` puts them
together."""

from __future__ import annotations

import re
from typing import Literal, TypeVar

from pydantic import Field

from imgbuild.nccltests import expected
from imgbuild.nccltests.log import Frozen, Network, ParsedLog, Printed, ResultTable, distinct

T = TypeVar("T", str, int)
Status = Literal["PASS", "WARN", "FAIL", "SKIP"]


class Criterion(Frozen):
    """One line of the verdict; one JUnit testcase."""

    name: str
    status: Status
    expected: str = ""
    found: str = ""
    reason: str = ""


class BandwidthCheck(Frozen):
    """A published figure against this run's row at the same size (for the JSON and the plot)."""

    size: int
    published: float
    floor: float = Field(description="published x (1 - tolerance): the least that passes")
    out_of_place: Printed | None
    in_place: Printed | None
    status: Status
    figure: expected.Figure


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


def network_used(net: Network) -> Criterion:
    """The network NCCL selected, judged against EFA (criterion "network"): aws-ofi-nccl loaded, NCCL using it, the
    efa provider. NCCL selects its network when it starts, so the log shows it on any node count: the verdict judges
    it for a run across nodes (on one node it only says which plugin loaded), verify's aws-ofi-nccl-loaded on one."""
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


def one_node_scope(ranks: int | None) -> str:
    """'one rank on one node', '8 ranks on one node' (or 'one node' when the log does not count its ranks)."""
    if ranks == 1:
        return "one rank on one node"
    return f"{ranks} ranks on one node" if ranks else "one node"


def one_node(log: ParsedLog, scope: str, instance_type: str | None, efa: bool | None) -> list[Criterion]:
    """A run on one node: NCCL moves its data inside the node (NVLink, PCIe, shared memory), so the network it
    would use between nodes is not judged. What the log does show: whether NCCL loaded aws-ofi-nccl, judged where
    the nodes have EFA (`efa`, from the instance type); a plugin that failed to start fails as on any node count."""
    net = log.network
    judged = network_used(net)
    if net.failures:  # a plugin that failed to start fails on any node count
        return [judged]
    found = judged.found
    network = Criterion(
        name="network",
        status="SKIP",
        found=found,
        reason=f"not judged: {scope}, so NCCL moved nothing over a network (inside a node it uses NVLink, PCIe or "
        "shared memory); which network it would use between nodes is proven by a run across nodes",
    )
    loaded = bool(net.plugin_version or net.providers or any(_is_libfabric(u) for u in net.used))
    said = (
        f"aws-ofi-nccl{f' {net.plugin_version}' if net.plugin_version else ''} loaded"
        if loaded
        else "aws-ofi-nccl not loaded" + (f" ({net.missing[0]})" if net.missing else "")
    )
    base = {"name": "network plugin", "expected": "aws-ofi-nccl loaded" if efa else "", "found": said}
    where = f"whether {instance_type} has EFA is not known" if instance_type else "the instance type is unknown"
    nodes_have = f"{instance_type} has" if instance_type else "the nodes have"
    status: Status
    if efa is False:
        status, reason = "SKIP", "not judged: the nodes have no EFA devices"
    elif not loaded and efa is None:
        status = "SKIP"
        reason = f"not judged: {where} (--instance-type names one with EFA): NCCL loads the plugin only to use EFA"
    elif not loaded:
        status = "FAIL"
        reason = (
            f"{nodes_have} EFA, but NCCL did not load aws-ofi-nccl: across nodes this setup would use "
            f"{', '.join(net.used) or 'its internal network'}, not EFA"
        )
    elif judged.status == "FAIL":  # loaded, but NCCL chose another network (sockets): across nodes too
        status, reason = ("FAIL", judged.reason) if efa else ("SKIP", f"not judged: {where}: {judged.reason}")
    else:
        status, reason = "PASS", "NCCL loaded the EFA plugin: between nodes it can use EFA"
    return [network, Criterion(**base, status=status, reason=reason)]


def one_node_bandwidth(log: ParsedLog, scope: str) -> Criterion:
    """Bus bandwidth on one node is not the network's: with one rank nothing moves between ranks (nccl-tests prints
    0, or the GPU's own copy rate for broadcast, reduce and sendrecv), with several it is the node's NVLink."""
    if not any(t.rows for t in log.tables):
        return Criterion(name="bandwidth", status="SKIP", reason="no results to judge")
    if log.ranks == 1:
        why = (
            "with one rank no data moves between ranks: nccl-tests' bus bandwidth is 0 by its formula, or for "
            "broadcast, reduce and sendrecv the GPU's own copy rate"
        )
    else:
        why = "bus bandwidth inside one node is NVLink's or PCIe's, not the network's"
    return Criterion(
        name="bandwidth",
        status="SKIP",
        reason=f"not judged: {scope}: {why}; the published figures are for runs across nodes",
    )


def nccl_version(found: tuple[str, ...], wanted: str | None) -> Criterion:
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


def plugin_version(found: str | None, wanted: str | None) -> Criterion | None:
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


def pick(what: str, from_log: T | None, given: T | None, evidence: str) -> tuple[T | None, str, Criterion | None]:
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


def repeated(tables: tuple[ResultTable, ...]) -> list[Criterion]:
    """A table that lists a size more than once holds more than one run: a finding, and every size is judged by its
    worst row (`ResultTable.at`), never by the last alone. The largest sizes are shown first."""
    out = []
    for k, t in enumerate(tables, 1):
        if not (rep := t.repeated):
            continue
        shown = ", ".join(f"{human_size(size)} x{n}" for size, n in sorted(rep.items(), reverse=True)[:6])
        more = f" and {len(rep) - 6} more" if len(rep) > 6 else ""
        out.append(
            Criterion(
                name="repeated sizes" if len(tables) == 1 else f"repeated sizes (table {k})",
                status="WARN",
                expected="each size once",
                found=f"{shown}{more}",
                reason=f"the table lists {len(rep)} size{'s' if len(rep) != 1 else ''} more than once: more than one "
                "run under one header (a log appended to?); each size is judged by its worst row",
            )
        )
    return out


def results(tables: tuple[ResultTable, ...]) -> list[Criterion]:
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

        unread = f"; {_unreadable(t)}" if t.unreadable else ""
        if not t.rows:
            out.append(crit("FAIL", "a header and no rows", f"the run stopped before its first result{unread}"))
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
                    f"corruption on the path (GPU, NIC or driver), not a slow network{unread}",
                )
            )
            continue
        broken = [r for r in t.rows if not r.sound]
        if broken:
            shown = ", ".join(
                f"{human_size(r.size)} ({r.out_of_place.busbw:g} out-of-place, {r.in_place.busbw:g} in-place GB/s)"
                for r in broken[:4]
            )
            out.append(
                crit(
                    "FAIL",
                    f"nan, inf or negative time or bandwidth at {len(broken)} sizes; {oob}",
                    f"not measurements at {shown}{' ...' if len(broken) > 4 else ''}: the run's timing broke "
                    f"(a hung or failed collective), so nothing it printed there is a result{unread}",
                )
            )
            continue
        if t.out_of_bounds is not None and (t.out_of_bounds > 0 or not t.out_of_bounds_ok):
            out.append(crit("FAIL", oob, f"nccl-tests counted {t.out_of_bounds} out-of-bounds values{unread}"))
            continue
        if t.unreadable:
            out.append(
                crit(
                    "WARN",
                    f"{len(t.rows)} sizes read, {len(t.unreadable)} lines under the header not; {oob}",
                    f"{_unreadable(t)}: their results (#wrong included) are unknown",
                )
            )
            continue
        top = max(r.size for r in t.rows)
        if t.max_bytes is not None and top < t.max_bytes and not t.footer:
            out.append(
                crit(
                    "WARN",
                    f"last size {human_size(top)} of {human_size(t.max_bytes)}; no footer",
                    f"the log ends at {human_size(top)}, before the run's last size ({human_size(t.max_bytes)}) and "
                    "nccl-tests' closing lines: the run stopped there or the log was cut; the sizes after it are "
                    "not known",
                )
            )
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
            worst = max(max(r.out_of_place.error or 0.0, r.in_place.error or 0.0) for r in t.rows)
            out.append(crit("PASS", f"{oob}; max error {worst:g}", f"{len(t.rows)} sizes, no out-of-bounds values"))
        else:
            out.append(crit("PASS", f"#wrong 0 at {len(t.rows)} sizes; {oob}", "every size validated"))
    return out


def _unreadable(t: ResultTable) -> str:
    """'could not read N lines under the table header (line 12: ...; ...)', or '' when every row was read."""
    if not t.unreadable:
        return ""
    n = len(t.unreadable)
    more = f" and {n - 3} more" if n > 3 else ""
    return f"could not read {n} line{'s' if n > 1 else ''} under the table header ({'; '.join(t.unreadable[:3])}{more})"


def bandwidth(
    log: ParsedLog, figures_table: expected.Table, instance_type: str | None, nodes: int | None
) -> tuple[list[Criterion], list[BandwidthCheck], list[str]]:
    measured = [t for t in log.tables if t.rows]
    if not measured:
        return [Criterion(name="bandwidth", status="SKIP", reason="no results to judge")], [], []
    wanted = figures_table.collective
    tables = [t for t in measured if t.collective in (None, wanted)]

    def not_judged(reason: str, found: str = "") -> tuple[list[Criterion], list[BandwidthCheck], list[str]]:
        return [Criterion(name="bandwidth", status="WARN", found=found, reason=f"not judged: {reason}")], [], []

    if not tables:
        ran = ", ".join(distinct(t.collective or "" for t in measured))
        return not_judged(f"the published figures are {wanted}'s, this log ran {ran}")
    if instance_type is None:
        return not_judged(
            "the instance type is unknown: the log does not name it (aws-ofi-nccl prints it only for "
            "some instance types) and no --instance-type was given"
        )
    if nodes is None:
        return not_judged("the node count is unknown: the log lists no ranks' hosts, and no --nodes was given")
    published = figures_table.for_run(instance_type, nodes)
    if not published:
        counts = figures_table.node_counts(instance_type)
        if not counts:
            unpublished = figures_table.unpublished_for(instance_type)
            if unpublished is not None:
                return not_judged(
                    f"no published figure exists for {instance_type}: none was found in {unpublished.searched} "
                    f"(searched {unpublished.searched_on}; bandwidth.yaml, unpublished); the network, NCCL and "
                    "results are still judged"
                )
            return not_judged(
                f"no published figure for {instance_type} (the table has {', '.join(figures_table.instance_types())})"
            )
        return not_judged(
            f"the figures published for {instance_type} are for "
            f"{' or '.join(str(c) for c in counts)} nodes; this run had {nodes}"
        )
    gpn = log.gpus_per_node
    if gpn is not None and gpn != published[0].gpus_per_node:
        return not_judged(
            f"the figures for {nodes}x {instance_type} are with {published[0].gpus_per_node} GPUs per "
            f"node; this run had {gpn} ranks per node"
        )
    # Only the sizes where the instance type's bus bandwidth has levelled off are judged (bandwidth.yaml, judging).
    figures = figures_table.judged(published)
    rule = figures_table.judging_for(instance_type)
    notes = []
    if below := [f for f in published if f not in figures]:
        shown = ", ".join(f"{human_size(f.size)} ({f.busbw:g} GB/s)" for f in below)
        notes.append(
            f"{instance_type} is judged from {human_size(rule.judged_from)} up, where its bus bandwidth has levelled "
            f"off (bandwidth.yaml, judging, says why); published at {shown}: shown, not judged."
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
            source = f"{fig.busbw:g} GB/s published for {nodes}x {instance_type} (NCCL {fig.nccl or 'not stated'})"
            exp_text = f">= {floor:g} GB/s ({fig.busbw:g} - {tol:.0%})"
            row = t.at(fig.size)
            status: Status
            if row is None:
                why = f"this run stops at {human_size(top)}" if top < fig.size else "no readable row at this size"
                status, found, reason = "SKIP", "not measured", why
            else:
                got = row.busbw
                found = f"{row.out_of_place.busbw:g} out-of-place, {row.in_place.busbw:g} in-place"
                reason = f"{got:g} GB/s is {got / fig.busbw:.0%} of the {source}"
                if not row.sound:
                    status = "FAIL"
                    reason = f"nan, inf or a negative number is not a measurement (the {source})"
                elif got >= floor:
                    status = "PASS"
                else:
                    status = "FAIL"
                    reason += f", below {1 - tol:.0%}"
                    if ran_nccl and fig.nccl and _version_key(ran_nccl).split(".")[:2] != fig.nccl.split(".")[:2]:
                        reason += f"; this run used NCCL {ran_nccl}"
            criteria.append(Criterion(name=name, status=status, expected=exp_text, found=found, reason=reason))
            checks.append(
                BandwidthCheck(
                    size=fig.size,
                    published=fig.busbw,
                    floor=floor,
                    out_of_place=row.out_of_place.busbw if row else None,
                    in_place=row.in_place.busbw if row else None,
                    status=status,
                    figure=fig,
                )
            )
    if all(c.status == "SKIP" for c in criteria):
        tops = ", ".join(distinct(human_size(max(r.size for r in t.rows)) for t in tables))
        sizes = ", ".join(human_size(f.size) for f in figures)
        reach = figures_table.max_judged_size(instance_type)
        return (
            not_judged(
                f"the published figures judged on {instance_type} are at {sizes}; this run stops at {tops}: run "
                f"all_reduce_perf to -e {expected.size_option(reach)} (imgbuild cluster job does)"
            )[0],
            checks,
            notes,
        )
    return criteria, checks, notes


def avg_notes(tables: tuple[ResultTable, ...]) -> list[str]:
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
