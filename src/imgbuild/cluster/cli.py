"""`imgbuild cluster report LOG`: the command line of report.py (a typer sub-app; the main CLI mounts `app` as
`imgbuild cluster`). Reading the log and writing the outputs happen here; the verdict is report.py's."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from imgbuild.cluster.jobs import job_command
from imgbuild.cluster.live import cluster_test_command
from imgbuild.errors import OutputError, VerifyError

if TYPE_CHECKING:
    from collections.abc import Callable

    from rich.console import Console

    from imgbuild.cluster.report import Report

app = typer.Typer(
    name="cluster",
    help="Run the image where clusters run jobs (EKS, Slurm, ssh hosts) and judge nccl-tests logs.",
    no_args_is_help=True,
)


@app.callback()
def cluster() -> None:
    """Run the image where clusters run jobs (EKS, Slurm, ssh hosts) and judge nccl-tests logs."""


app.command("job")(job_command)  # jobs.py imports only typer at the top: start-up stays light
app.command("test")(cluster_test_command)  # so does live.py


_STYLE = {"PASS": "green", "FAIL": "bold red", "WARN": "yellow", "SKIP": "dim"}
_OPTION = {"instance_type": "--instance-type", "nodes": "--nodes", "nccl_version": "--nccl-version"}
# Rows of the result table shown on the terminal: the large sizes, where the network is measured.
_SHOWN_FROM = 64 * 1024 * 1024
# What a terminal shows of a log of any shape (thousands of tables, a table of 40000 rows): the JSON and JUnit
# files carry everything.
_SHOWN_CRITERIA = 40
_SHOWN_TABLES = 8
_SHOWN_ROWS = 16
_NAMED_FAILURES = 6


@app.command("report")
def report_command(
    log: Annotated[
        str, typer.Argument(metavar="LOG", help="An nccl-tests log (NCCL_DEBUG=INFO); '-' or nothing: stdin.")
    ] = "-",
    instance_type: Annotated[
        str | None,
        typer.Option("--instance-type", help="e.g. p5.48xlarge, when the log does not say (aws-ofi-nccl often does)."),
    ] = None,
    nodes: Annotated[
        int | None, typer.Option("--nodes", min=1, help="Node count, when the log does not list the ranks' hosts.")
    ] = None,
    nccl_version: Annotated[
        str | None, typer.Option("--nccl-version", metavar="X.Y.Z", help="The NCCL the job should have loaded.")
    ] = None,
    plot: Annotated[
        Path | None, typer.Option("--plot", metavar="FILE.png", help="Draw bus bandwidth against message size.")
    ] = None,
    json_path: Annotated[Path | None, typer.Option("--json", metavar="FILE", help="Write the report as JSON.")] = None,
    junit: Annotated[
        Path | None, typer.Option("--junit", metavar="FILE", help="Write JUnit XML (one testcase per criterion).")
    ] = None,
) -> None:
    """Say whether an nccl-tests run used EFA, loaded the expected NCCL, got correct results and reached the bus
    bandwidth published for its instance type and node count. Exit 0 on PASS or WARN, 11 on FAIL, 14 when a file
    asked for (--json, --junit, --plot) could not be written (11 still wins on FAIL)."""
    from imgbuild.console import handled

    handled(_report)(log, instance_type, nodes, nccl_version, plot, json_path, junit)


def _report(
    log: str,
    instance_type: str | None,
    nodes: int | None,
    nccl_version: str | None,
    plot: Path | None,
    json_path: Path | None,
    junit: Path | None,
) -> None:
    from pydantic import ValidationError

    from imgbuild.cluster import report
    from imgbuild.console import out

    text, source = _read(log)
    try:
        expect = report.Expect(instance_type=instance_type, nodes=nodes, nccl_version=nccl_version)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else ""
        raise typer.BadParameter(
            f"{first['input']!r}: {first['msg']}", param_hint=f"'{_OPTION.get(field, field)}'"
        ) from None
    rep = report.judge(report.parse(text), expect, source=source)
    render(rep, out())
    # Every output is tried, whichever fails first; the verdict's exit code wins over an output's, so that a FAIL
    # never reads as a tooling error.
    problems = []
    for path, make in _outputs(rep, json_path, junit, plot):
        try:
            _write(path, make())
        except OutputError as exc:
            problems.append(exc.message if exc.message.startswith(f"{path}: ") else f"{path}: {exc}")
    if rep.verdict == "FAIL":
        also = f"; and {'; '.join(problems)}" if problems else ""
        failed = [c.name for c in rep.failed]
        more = f" and {len(failed) - _NAMED_FAILURES} more" if len(failed) > _NAMED_FAILURES else ""
        raise VerifyError(f"{source}: FAIL ({', '.join(failed[:_NAMED_FAILURES])}{more}){also}")
    if problems:
        raise OutputError(f"{'; '.join(problems)} (the verdict, {rep.verdict}, is above)")


def _outputs(
    rep: Report, json_path: Path | None, junit: Path | None, plot: Path | None
) -> list[tuple[Path, Callable[[], bytes]]]:
    """The files asked for, each with what makes its bytes (drawing the plot is left until it is written)."""
    from imgbuild.cluster import report

    def png() -> bytes:
        from imgbuild.cluster import plot as plotting

        return plotting.png(rep)

    wanted: list[tuple[Path | None, Callable[[], bytes]]] = [
        (json_path, lambda: report.to_json(rep).encode()),
        (junit, lambda: report.junit_xml(rep).encode()),
        (plot, png),
    ]
    return [(path, make) for path, make in wanted if path is not None]


def _read(log: str) -> tuple[str, str]:
    if log == "-":
        if sys.stdin.isatty():
            raise typer.BadParameter(
                "no LOG given and stdin is a terminal: name a file or pipe a log in", param_hint="LOG"
            )
        return sys.stdin.read(), "<stdin>"
    try:
        data = Path(log).read_bytes()
    except OSError as exc:
        raise typer.BadParameter(f"{log}: {exc.strerror}", param_hint="LOG") from None
    # Logs mix in whatever the job printed: undecodable bytes are replaced, never a reason to refuse the log.
    return data.decode("utf-8", errors="replace"), log


def _write(path: Path, data: bytes) -> None:
    """OutputError naming the path when it cannot be written."""
    try:
        path.write_bytes(data)
    except OSError as exc:
        raise OutputError(f"{path}: cannot write the report: {exc.strerror or exc}") from None


def render(rep: Report, console: Console) -> None:
    """The report for a terminal: what ran, one row per criterion, the large sizes against the published figures,
    the note on 'Avg bus bandwidth', and the verdict."""
    from rich.table import Table
    from rich.text import Text

    from imgbuild.cluster.report import human_size

    parsed = rep.log
    console.print(Text(f"nccl-tests report: {rep.source}", style="bold"))
    shape = [
        f"instance type {rep.instance_type or 'unknown'} ({rep.instance_type_from})",
        f"{rep.nodes if rep.nodes is not None else '?'} nodes ({rep.nodes_from})",
    ]
    if parsed.ranks:
        shape.append(f"{parsed.ranks} ranks")
    shape.append(f"NCCL {', '.join(parsed.nccl_versions) or 'not in the log'}")
    console.print(Text("  " + "; ".join(shape)))

    crit = Table("criterion", "status", "expected", "found", "reason", box=None, pad_edge=False)
    for c in rep.criteria[:_SHOWN_CRITERIA]:
        crit.add_row(
            Text(c.name), Text(c.status, style=_STYLE[c.status]), Text(c.expected), Text(c.found), Text(c.reason)
        )
    console.print(crit)
    if len(rep.criteria) > _SHOWN_CRITERIA:
        console.print(Text(f"... {len(rep.criteria) - _SHOWN_CRITERIA} more criteria (--json and --junit list all)"))

    published = {c.size: c for c in rep.bandwidth}
    measured = [(k, t) for k, t in enumerate(parsed.tables, 1) if t.rows]
    for k, t in measured[:_SHOWN_TABLES]:
        rows = [r for r in t.rows if r.size >= _SHOWN_FROM] or list(t.rows[-6:])
        title = f"bus bandwidth, GB/s ({t.collective or 'collective not named'}"
        title += f", table {k})" if len(parsed.tables) > 1 else ")"
        bw = Table(
            "size", "out-of-place", "in-place", "published", box=None, pad_edge=False, title=title, title_justify="left"
        )
        for r in rows[:_SHOWN_ROWS]:
            check = published.get(r.size)
            bw.add_row(
                human_size(r.size),
                f"{r.out_of_place.busbw:g}",
                f"{r.in_place.busbw:g}",
                Text(f"{check.published:g} (pass >= {check.floor:g})", style=_STYLE[check.status]) if check else "",
            )
        console.print(bw)
        if len(rows) > _SHOWN_ROWS:
            console.print(Text(f"... {len(rows) - _SHOWN_ROWS} more rows (--json lists all)"))
    if len(measured) > _SHOWN_TABLES:
        console.print(Text(f"... {len(measured) - _SHOWN_TABLES} more result tables (--json lists all)"))
    for note in rep.notes:
        console.print(Text(note, style="dim"))
    n = rep.counts()
    console.print(
        Text(f"{rep.verdict}", style=_STYLE[rep.verdict])
        + Text(f": {n['PASS']} passed, {n['FAIL']} failed, {n['WARN']} to check, {n['SKIP']} not judged")
    )
