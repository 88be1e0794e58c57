"""`imgbuild verify RECIPE|IMAGE`: the command line of imgbuild.verify, and its results table (`finish`, which
`imgbuild cluster test` ends with too)."""

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from imgbuild.cli.console import handled, out, platform_arch, resolved
from imgbuild.core.errors import VerifyError
from imgbuild.core.interrupts import terminable

if TYPE_CHECKING:
    from rich.console import Console

    from imgbuild.verify.report import VerifyReport

MAX_NODES = 64  # containers on one engine; a larger number would only fail later (or overflow a C integer)
_STYLE = {"pass": "green", "fail": "bold red", "skip": "yellow"}


def register(app: typer.Typer) -> None:
    """Add the `verify` command to `app`."""
    app.command("verify")(verify_command)


@handled
@terminable
def verify_command(
    ref: Annotated[
        str, typer.Argument(metavar="RECIPE|IMAGE", help="A recipe (name or YAML file) or an image reference.")
    ],
    host: Annotated[
        str | None,
        typer.Option(help="Check a machine instead of a container: 'local' or ssh://USER@HOST."),
    ] = None,
    device: Annotated[
        list[str] | None, typer.Option("--device", help="HOST[:CONTAINER[:PERMS]] to pass in, repeatable.")
    ] = None,
    expect_efa: Annotated[
        bool, typer.Option("--expect-efa", help="EFA devices must work (fi_info -p efa) even if none are passed.")
    ] = False,
    nodes: Annotated[
        int, typer.Option(min=1, max=MAX_NODES, help="With N >= 2, also verify mpirun/NCCL across N containers.")
    ] = 1,
    junit: Annotated[Path | None, typer.Option("--junit", help="Write JUnit XML here.")] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the results and timings as JSON.")] = None,
    platform: Annotated[
        str | None,
        typer.Option(
            "--platform",
            callback=platform_arch,
            help="linux/amd64 or linux/arm64: which of the recipe's architectures (its image `imgbuild build "
            "--platform` tagged); another architecture than this machine's runs under QEMU.",
        ),
    ] = None,
) -> None:
    """Verify an image (or a machine) against its recipe's lock: versions, NCCL, plugin, sshd, keys, GPUs."""
    from imgbuild.verify import command
    from imgbuild.verify.target import names_recipe, target_for_recipe

    # A recipe is read once, here (its lock: exit 4 when missing, before any engine is asked), and handed down.
    target = target_for_recipe(ref, resolved(ref)[1], platform) if names_recipe(ref) else None
    report = command.verify(
        target or ref, host=host, devices=device or [], expect_efa=expect_efa, nodes=nodes, arch=platform
    )
    finish(report, junit, json_path)


def finish(report: "VerifyReport", junit: Path | None, json_path: Path | None) -> None:
    """Show the report, write JUnit / JSON where asked, and end with exit 11 naming the failed checks."""
    from imgbuild.core.errors import OutputError
    from imgbuild.core.outputs import write_file
    from imgbuild.verify.report import junit_xml, report_json

    render_table(report, out())
    problems: list[str] = []  # as `cluster report`: every file asked for is tried; a failed check (11) wins over 14
    for path, make, what in (
        (junit, junit_xml, "the JUnit report"),
        (json_path, report_json, "the JSON report"),
    ):
        if path is not None:
            try:
                write_file(path, make(report), what=what)
            except OutputError as exc:
                problems.append(exc.message)
    if report.failed:
        names = ", ".join(dict.fromkeys(r.name for r in report.failed))
        unwritten = f" ({'; '.join(problems)})" if problems else ""
        raise VerifyError(f"{len(report.failed)} of {len(report.results)} checks failed: {names}{unwritten}")
    if problems:
        raise OutputError("; ".join(problems))


def render_table(report: "VerifyReport", console: "Console") -> None:
    """One row per check (check, expected, found, status, reason), then a summary line with the timings."""
    from rich.table import Table
    from rich.text import Text

    table = Table("check", "expected", "found", "status", "reason", box=None, pad_edge=False)
    for r in report.results:
        name = f"{r.name} [{r.node}]" if r.node else r.name
        table.add_row(
            Text(name), Text(r.expected), Text(r.found), Text(r.status, style=_STYLE[r.status]), Text(r.reason)
        )
    console.print(Text(f"verify {report.target}: image {report.image or '-'}, in {report.where}"))
    if report.note:
        console.print(Text(f"  {report.note}"))
    console.print(table)
    c, t = report.counts(), report.timings
    phases = ", ".join(f"{k.removesuffix('_s').replace('_', ' ')} {v:.1f}s" for k, v in t.items() if k != "total_s")
    console.print(
        Text(f"{c['pass']} passed, {c['fail']} failed, {c['skip']} skipped in {t.get('total_s', 0):.1f}s ({phases})")
    )
