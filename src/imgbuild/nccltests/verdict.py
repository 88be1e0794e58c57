"""Judge an nccl-tests run: the network NCCL used, its version, correct results, bus bandwidth.

Pure functions, no I/O: `judge(log, expect)` -> `Report` from what log.py's `parse(text)` read, and the
report's outputs (`junit_xml`, `to_json`). `imgbuild cluster report` (cli/cluster.py) reads the log, writes the
outputs and draws (cluster/plot.py); the nccl-tests check across nodes (verify/nodeworkloads.py) judges its run here
too. Each criterion is criteria.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from imgbuild.core import instances
from imgbuild.nccltests import criteria as rules
from imgbuild.nccltests import expected
from imgbuild.nccltests.criteria import BandwidthCheck, Criterion, Status, human_size, network_used
from imgbuild.nccltests.log import Frozen, ParsedLog, distinct, parse

if TYPE_CHECKING:
    from imgbuild.pin.resolver import Resolved

__all__ = [
    "BandwidthCheck",
    "Criterion",
    "Expect",
    "Report",
    "Status",
    "Verdict",
    "human_size",
    "judge",
    "junit_xml",
    "network_used",
    "report",
    "to_json",
]

Verdict = Literal["PASS", "WARN", "FAIL"]


class Expect(Frozen):
    """What the run should show. Every field is optional: what is not given is not judged (and the report says so),
    except the instance type and node count, which the log itself may give."""

    instance_type: str | None = Field(None, pattern=r"^[a-z][a-z0-9-]*\.[a-z0-9]+$")
    nodes: int | None = Field(None, ge=1)
    nccl_version: str | None = Field(None, pattern=r"^\d+\.\d+\.\d+$")
    aws_ofi_nccl_version: str | None = Field(None, pattern=r"^\d+\.\d+\.\d+\S*$")
    efa: bool | None = Field(
        None,
        description="whether the nodes have EFA devices (None: unknown; by default what core/instances.yaml says of "
        "the instance type); judges the plugin of a one-node run",
    )

    @model_validator(mode="before")
    @classmethod
    def _efa_of_the_instance_type(cls, data: Any) -> Any:
        """The nodes have EFA devices where the instance type's family has some (core.instances: one rule for `cluster
        job`'s devices and this verdict), unless the caller says."""
        if isinstance(data, dict) and data.get("efa") is None and isinstance(data.get("instance_type"), str):
            count = instances.efa_devices(data["instance_type"])
            if count is not None:
                return {**data, "efa": count > 0}
        return data

    @classmethod
    def from_resolved(cls, resolved: Resolved, *, instance_type: str | None = None, nodes: int | None = None) -> Expect:
        """The expectations of an image built from `resolved` (a recipe's lock): its NCCL and aws-ofi-nccl pins,
        and its instance type when the recipe names exactly one (an explicit `instance_type` wins)."""
        types = resolved.recipe.platform.instance_types
        return cls.of_pins(
            resolved.version, instance_type=instance_type or (types[0] if len(types) == 1 else None), nodes=nodes
        )

    @classmethod
    def of_pins(
        cls,
        version: Callable[[str], str | None],
        *,
        instance_type: str | None = None,
        nodes: int | None = None,
        plugin: bool = True,
        efa: bool | None = None,
    ) -> Expect:
        """The expectations of an image from its pins (`version(component)`: a lock's, a manifest's): its NCCL and,
        where `plugin` (the run must use it), its aws-ofi-nccl; `efa`: whether the nodes have EFA devices."""
        return cls(
            instance_type=instance_type,
            nodes=nodes,
            nccl_version=version("nccl"),
            aws_ofi_nccl_version=version("aws_ofi_nccl") if plugin else None,
            efa=efa,
        )


class Report(Frozen):
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
    criteria: list[Criterion] = [rules.nccl_version(log.nccl_versions, expect.nccl_version)]
    plugin = rules.plugin_version(log.network.plugin_version, expect.aws_ofi_nccl_version)
    if plugin:
        criteria.append(plugin)
    claimed = expect.instance_type
    evidence = f"'{log.instance_type_evidence}'"
    if claimed is not None and any(t != claimed for t in log.instance_types):
        # The log's own lines (aws-ofi-nccl's platform line) name another type: it cannot vouch for the cluster
        # claimed. Bandwidth is judged as what ran when the log names one type.
        named = ", ".join(log.instance_types)
        criteria.append(
            Criterion(
                name="instance type",
                status="FAIL",
                expected=claimed,
                found=named,
                reason=f"the run was claimed to be on {claimed}, but the log's own lines name {named} ({evidence}): "
                f"this log is not from {claimed} instances",
            )
        )
        instance_type: str | None = log.instance_types[0] if len(log.instance_types) == 1 else None
        it_from = f"log: {evidence}" if instance_type else "unknown"
    elif len(log.instance_types) > 1:
        named = ", ".join(log.instance_types)
        criteria.append(
            Criterion(
                name="instance type",
                status="WARN",
                found=named,
                reason=f"the log names several instance types ({named}): judged as none",
            )
        )
        instance_type = None
        it_from = "unknown"
    else:
        from_log = log.instance_types[0] if log.instance_types else None
        instance_type, it_from, _ = rules.pick("instance type", from_log, claimed, evidence)
    nodes, nodes_from, nodes_crit = rules.pick(
        "nodes",
        log.nodes,
        expect.nodes,
        f"{len(log.hosts)} hosts in the Rank lines" if log.hosts else f"NCCL's nNodes {log.nnodes}",
    )
    criteria += [nodes_crit] if nodes_crit else []
    criteria += rules.results(log.tables)
    criteria += rules.repeated(log.tables)
    if nodes == 1:  # nothing crossed a network: judged is what the log can show (one_node says which)
        scope = rules.one_node_scope(log.ranks)
        criteria[:0] = rules.one_node(log, scope, instance_type, expect.efa)
        bw_criteria: list[Criterion] = [rules.one_node_bandwidth(log, scope)]
        checks: list[BandwidthCheck] = []
        bw_notes = [
            f"{scope[0].upper()}{scope[1:]}: a smoke test of the GPUs and NCCL, not of the network. The network and "
            "the bus bandwidth are judged on runs across nodes (imgbuild cluster job)."
        ]
    else:
        criteria.insert(0, rules.network_used(log.network))
        bw_criteria, checks, bw_notes = rules.bandwidth(log, table, instance_type, nodes)
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
        notes=distinct([*bw_notes, *rules.avg_notes(log.tables)]),
        log=log,
    )


def report(text: str, expect: Expect | None = None, *, source: str = "-") -> Report:
    """parse + judge."""
    return judge(parse(text), expect, source=source)


def junit_xml(rep: Report) -> str:
    """JUnit XML: one testcase per criterion; FAIL -> <failure>, WARN and SKIP -> <skipped> (WARN says so), PASS
    carries its evidence in <system-out>."""
    from imgbuild.checks.results import CheckResult
    from imgbuild.checks.results import Status as CheckStatus
    from imgbuild.checks.results import junit_xml as junit_suite

    status: dict[Status, CheckStatus] = {"PASS": "pass", "FAIL": "fail", "WARN": "skip", "SKIP": "skip"}
    results = [
        CheckResult(
            name=c.name,
            status=status[c.status],
            expected=c.expected,
            found=c.found,
            reason=c.reason if c.status in ("PASS", "FAIL") else f"{c.status}: {c.reason}",
            component="report",
        )
        for c in rep.criteria
    ]
    properties = (
        ("verdict", rep.verdict),
        ("instance_type", rep.instance_type or ""),
        ("nodes", "" if rep.nodes is None else str(rep.nodes)),
        ("nccl_version", ", ".join(rep.log.nccl_versions)),
        ("tolerance", str(rep.tolerance)),
    )
    return junit_suite(
        "imgbuild cluster report",
        rep.source,
        results,
        classname="imgbuild.cluster",
        failure_type="ClusterReportFailure",
        properties=properties,
    )


def to_json(rep: Report) -> str:
    """Strict JSON (RFC 8259): no NaN or Infinity tokens. A log's nan or inf is the string "NaN", "Infinity" or
    "-Infinity" (pydantic's ser_json_inf_nan="strings"; the schema says so)."""
    import json

    data = json.loads(rep.model_dump_json())
    return json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n"
