"""`imgbuild cluster ...`: the command lines of the cluster commands (a typer sub-app; the main CLI mounts `app` as
`imgbuild cluster`).

- `job`: a ready-to-apply job for a recipe's image (imgbuild.cluster.jobs renders it);
- `test`: the multi-node checks on containers running on hosts (imgbuild.cluster.live runs them over ssh; the
  results are shown and written as `imgbuild verify`'s are);
- `report LOG`: the verdict on an nccl-tests log (imgbuild.nccltests.verdict). Reading the log, writing the outputs
  and the terminal view happen here.

Start-up stays light: at the top only typer and what the options' types and callbacks need; each command imports
the rest when it runs.
"""

import os
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, BinaryIO

import typer

from imgbuild.cli.console import handled
from imgbuild.cluster.jobplan import NAME_MAX, NODES_MAX, Engine, program_words
from imgbuild.core import validate
from imgbuild.core.errors import OutputError, VerifyError
from imgbuild.core.outputs import write_file

if TYPE_CHECKING:
    from collections.abc import Callable

    from rich.console import Console

    from imgbuild.image.manifest import Manifest
    from imgbuild.nccltests.verdict import Report

app = typer.Typer(
    name="cluster",
    help="Run the image where clusters run jobs (EKS, Slurm, ssh hosts) and judge nccl-tests logs.",
    no_args_is_help=True,
)


@app.callback()
def cluster() -> None:
    """Run the image where clusters run jobs (EKS, Slurm, ssh hosts) and judge nccl-tests logs."""


# --------------------------------------------------------------------------------------------------------------
# Command line: `imgbuild cluster job`
#
# A malformed value (its grammar, its range) is a usage error naming the option (exit 2), refused before the recipe
# is read; a well-formed one that the recipe cannot run with (an engine without PyTorch, an instance type without
# the recipe's accelerator, no known EFA count) is plan_job's RecipeError (exit 3).


def _command_words(words: list[str] | None) -> list[str] | None:
    try:
        program_words(words or ())
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    return words


def _efa_count(count: int | None) -> int | None:
    """--efa: at most as many EFA devices as any instance imgbuild knows has (more never schedules)."""
    from imgbuild.core import instances

    if count is not None and count > instances.efa_max():
        raise typer.BadParameter(f"{count} is more EFA devices than any instance has (at most {instances.efa_max()})")
    return count


@app.command("job")
def job_command(
    recipe: Annotated[str, typer.Argument(help="A shipped recipe's name (see `imgbuild list`) or a YAML file.")],
    command: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="COMMAND",
            help="After `--`: what the ranks run instead of the default (nccl-tests all_reduce_perf, else an MPI "
            "check); for trainjob/pytorchjob, torchrun's program (a script and its arguments).",
            callback=_command_words,
        ),
    ] = None,
    engine: Annotated[
        Engine,
        typer.Option(
            "--engine", "-e", help="MPI Operator, Trainer v2, training-operator 1.9, or Slurm.", case_sensitive=False
        ),
    ] = Engine.mpijob,
    nodes: Annotated[
        int, typer.Option("--nodes", "-n", min=1, max=NODES_MAX, help="Nodes (workers) the job runs on.")
    ] = 2,
    image: Annotated[
        str | None,
        typer.Option(
            "--image",
            metavar="URI",
            help="A pushed copy of the image (default: the lock's local tag).",
            callback=validate.option(validate.image_ref),
        ),
    ] = None,
    instance_type: Annotated[
        str | None,
        typer.Option(
            "--instance-type",
            help="EC2 instance type of the nodes (default: the recipe's first; one that carries the recipe's "
            "accelerator); sets the EFA count and how far nccl-tests runs.",
            callback=validate.option(validate.instance_type),
        ),
    ] = None,
    efa: Annotated[
        int | None,
        typer.Option(
            "--efa", min=0, callback=_efa_count, help="EFA devices per node, for an instance type not in the table."
        ),
    ] = None,
    memory: Annotated[
        str | None,
        typer.Option(
            "--memory",
            help="Memory per node (Kubernetes quantity; default 32Gi, 2Gi on CPU).",
            callback=validate.option(validate.quantity),
        ),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option(
            "--name",
            help=f"The job's name (default imgbuild-RECIPE; a DNS label of at most {NAME_MAX} characters).",
            callback=validate.option(lambda v: validate.dns_label(v, NAME_MAX)),
        ),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", metavar="FILE", help="Write the job here instead of stdout.")
    ] = None,
) -> None:
    """Render a ready-to-apply job for the recipe's image: an MPIJob, a TrainJob, a PyTorchJob or an sbatch script
    that runs nccl-tests' all_reduce_perf (or COMMAND) across the nodes."""
    handled(_job)(recipe, list(command or ()), engine, nodes, image, instance_type, efa, memory, name, output)


def _job(
    ref: str,
    command: list[str],
    engine: Engine,
    nodes: int,
    image: str | None,
    instance_type: str | None,
    efa: int | None,
    memory: str | None,
    name: str | None,
    output: Path | None,
) -> None:
    import imgbuild.cli.console as console
    from imgbuild.cli.console import err, warn
    from imgbuild.cluster.jobs import plan_job, render_plan

    _, resolved = console.resolved(ref)
    warn(resolved)
    job = plan_job(
        resolved,
        engine,
        nodes,
        image=image,
        instance_type=instance_type,
        command=command,
        name=name,
        efa=efa,
        memory=memory,
    )
    text = render_plan(job)
    if not job.image_pushed:
        err().print(
            f"imgbuild: note: {job.image} is the local build's tag; push it (imgbuild push {job.recipe}) and "
            "pass --image URI so that the cluster can pull it",
            markup=False,
        )
    if output is None:
        sys.stdout.write(text)
        return
    write_file(output, text, what="the job")
    err().print(f"imgbuild: wrote {output} ({job.engine.value}, {job.nodes} nodes)", markup=False)


# --------------------------------------------------------------------------------------------------------------
# Command line: `imgbuild cluster test`


@app.command("test")
@handled
def cluster_test_command(
    hosts: Annotated[
        str,
        typer.Option(
            "--hosts",
            metavar="H1,H2[,...]",
            help="The hosts running the image's container (imgbuild run), in order: the first runs the "
            "launchers. Names or addresses this machine and the first host reach them by.",
        ),
    ],
    port: Annotated[
        int | None, typer.Option("--port", min=1, max=65535, help="Their sshd port (default: the recipe's; 3022).")
    ] = None,
    recipe_ref: Annotated[
        str | None, typer.Option("--recipe", metavar="RECIPE", help="The recipe whose image must be running.")
    ] = None,
    image: Annotated[
        str | None,
        typer.Option(
            "--image",
            metavar="IMAGE",
            help="A local image whose manifest must be running.",
            callback=validate.option(validate.image_ref),
        ),
    ] = None,
    ssh_key: Annotated[
        Path | None,
        typer.Option("--ssh-key", metavar="FILE", help="Private key for ssh to the hosts (default: ssh's own)."),
    ] = None,
    user: Annotated[
        str, typer.Option("--user", help="The user to log in as.", callback=validate.option(validate.user_name))
    ] = "root",
    master_port: Annotated[
        int | None, typer.Option("--master-port", min=1, max=65535, help="torchrun's port on the first host (29500).")
    ] = None,
    junit: Annotated[Path | None, typer.Option("--junit", help="Write JUnit XML here.")] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the results and timings as JSON.")] = None,
) -> None:
    """Check a running cluster: from the first host, over ssh, the environment, MPI, PyTorch DDP (mpirun and
    torchrun) and nccl-tests (where there are GPUs) across the hosts, with the launch line `train` uses.
    Exit 11 when a check fails."""
    from imgbuild.cli.verify import finish
    from imgbuild.cluster.live import run_live

    if recipe_ref and image:
        raise typer.BadParameter("give --recipe or --image, not both", param_hint="'--recipe' / '--image'")
    # Host names reach ssh's command line, the hostfile and the checks' scripts: a name, never an option.
    try:
        names = validate.hosts(hosts)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--hosts'") from None
    if ssh_key is not None and not ssh_key.is_file():
        raise typer.BadParameter(f"{ssh_key}: no such file", param_hint="'--ssh-key'")
    expected = _expected(recipe_ref, image)
    finish(
        run_live(names, port=port, user=user, key=ssh_key, expected=expected, master_port=master_port), junit, json_path
    )


def _expected(recipe_ref: str | None, image: str | None) -> "Manifest | None":
    """The manifest the running image must have: the recipe's lock, or a local image's own; None: no expectation."""
    from imgbuild.cli.console import resolved
    from imgbuild.verify.command import image_manifest
    from imgbuild.verify.target import resolve_target, target_for_recipe

    if recipe_ref:
        return target_for_recipe(recipe_ref, resolved(recipe_ref)[1]).expected_manifest
    if image:
        from imgbuild.engine import client as engine
        from imgbuild.engine.containers import Containers

        client = engine.connect()
        containers = Containers(client)
        try:
            target = resolve_target(image, client)
            manifest = image_manifest(containers, target)
        finally:
            containers.remove_all()
            client.close()
        if manifest is None:
            from imgbuild.core.paths import MANIFEST_PATH

            raise VerifyError(f"{image} has no {MANIFEST_PATH}: not an imgbuild image")
        return manifest
    return None


# --------------------------------------------------------------------------------------------------------------
# Command line: `imgbuild cluster report`

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
        str | None, typer.Option("--plot", metavar="FILE.png", help="Draw bus bandwidth against message size.")
    ] = None,
    json_path: Annotated[
        str | None, typer.Option("--json", metavar="FILE", help="Write the report as JSON ('-': stdout).")
    ] = None,
    junit: Annotated[
        str | None,
        typer.Option("--junit", metavar="FILE", help="Write JUnit XML, one testcase per criterion ('-': stdout)."),
    ] = None,
) -> None:
    """Say whether an nccl-tests run used EFA, loaded the expected NCCL, got correct results and reached the bus
    bandwidth published for its instance type and node count. Exit 0 on PASS or WARN, 11 on FAIL, 14 when a file
    asked for (--json, --junit, --plot) could not be written (11 still wins on FAIL), 2 for a LOG that cannot be
    read (missing, a folder or a device, over 256 MiB). With --json - or --junit -, that document alone goes to
    stdout and the table to stderr."""
    targets = _targets(json_path, junit, plot)
    handled(_report)(log, instance_type, nodes, nccl_version, *targets)


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

    from imgbuild.cli.console import err, out
    from imgbuild.nccltests import verdict
    from imgbuild.nccltests.log import parse

    text, source = _read(log)
    try:  # whether the nodes have EFA: what core/instances.yaml says of the instance type (the verdict's rule)
        expect = verdict.Expect(instance_type=instance_type, nodes=nodes, nccl_version=nccl_version)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else ""
        raise typer.BadParameter(
            f"{first['input']!r}: {first['msg']}", param_hint=f"'{_OPTION.get(field, field)}'"
        ) from None
    rep = verdict.judge(parse(text), expect, source=source)
    # A document asked for on stdout is all stdout carries, so that `--json - | jq` reads JSON; the table, which says
    # the same for people, goes to stderr then.
    render(rep, err() if any(p is STDOUT for p in (json_path, junit)) else out())
    # Every output is tried, whichever fails first; the verdict's exit code wins over an output's, so that a FAIL
    # never reads as a tooling error.
    problems = []
    for path, make in _outputs(rep, json_path, junit, plot):
        try:
            _write(path, make())
        except OutputError as exc:
            name = "stdout" if path is STDOUT else str(path)
            problems.append(exc.message if exc.message.startswith(f"{name}: ") else f"{name}: {exc}")
    if rep.verdict == "FAIL":
        also = f"; and {'; '.join(problems)}" if problems else ""
        failed = [c.name for c in rep.failed]
        more = f" and {len(failed) - _NAMED_FAILURES} more" if len(failed) > _NAMED_FAILURES else ""
        raise VerifyError(f"{source}: FAIL ({', '.join(failed[:_NAMED_FAILURES])}{more}){also}")
    if problems:
        raise OutputError(f"{'; '.join(problems)} (the verdict, {rep.verdict}, is above)")


def _outputs(
    rep: "Report", json_path: Path | None, junit: Path | None, plot: Path | None
) -> "list[tuple[Path, Callable[[], bytes]]]":
    """The files asked for, each with what makes its bytes (drawing the plot is left until it is written)."""
    from imgbuild.nccltests import verdict

    def png() -> bytes:
        from imgbuild.cluster import plot as plotting

        return plotting.png(rep)

    wanted: list[tuple[Path | None, Callable[[], bytes]]] = [
        (json_path, lambda: verdict.to_json(rep).encode()),
        (junit, lambda: verdict.junit_xml(rep).encode()),
        (plot, png),
    ]
    return [(path, make) for path, make in wanted if path is not None]


# `--json -` / `--junit -`: the document goes to stdout (the LOG argument's `-` is stdin). Told apart by
# identity (`is`): a path typed as `./-` or `/dev/stdout` is a file like any other.
STDOUT = Path("/dev/stdout")
# The largest log read, from a file or stdin: far above the nccl-tests logs seen (the shared ones, up to 8 nodes with
# NCCL_DEBUG=INFO, are under 0.1 MiB; INFO adds some hundred lines a rank, so thousands of ranks stay below it), and
# what parsing, linear in the log, gets through in about a minute and 1.5 GB of memory on a 2-core machine (32 MiB
# of a real log: 7.8 s, 190 MB). Past it the log is refused, naming it, rather than read forever (`/dev/zero`, a
# `yes |` pipe) or until memory runs out.
MAX_LOG_BYTES = 256 << 20
_CHUNK = 1 << 20


def _targets(json_path: str | None, junit: str | None, plot: str | None) -> tuple[Path | None, ...]:
    """(plot, json, junit) as paths, `-` as STDOUT; a usage error (exit 2) for --plot - (a PNG is binary, not for a
    terminal or a text pipe) and for --json - with --junit - (two documents in one stream cannot be told apart)."""
    if plot == "-":
        raise typer.BadParameter("a PNG is binary: name a file (e.g. --plot report.png)", param_hint="'--plot'")
    if json_path == "-" and junit == "-":
        raise typer.BadParameter(
            "only one of --json and --junit can be '-' (stdout): name a file for the other", param_hint="'--junit'"
        )

    def path(value: str | None) -> Path | None:
        return None if value is None else STDOUT if value == "-" else Path(value)

    return path(plot), path(json_path), path(junit)


def _read(log: str) -> tuple[str, str]:
    """The log's text and the name the report gives it. A usage error (exit 2) naming LOG for what cannot be read as
    a log: missing, unreadable, a folder, a device or socket (`/dev/zero` would be read forever), or more than
    MAX_LOG_BYTES. A regular file, stdin (`-`), a pipe or a FIFO (`<(kubectl logs ...)`) are read."""
    if log == "-":
        if sys.stdin.isatty():
            raise typer.BadParameter(
                "no LOG given and stdin is a terminal: name a file or pipe a log in", param_hint="LOG"
            )
        return _decode(_read_capped(sys.stdin.buffer, "stdin")), "<stdin>"
    try:
        st = os.stat(log)
        if stat.S_ISDIR(st.st_mode):
            raise typer.BadParameter(f"{log}: is a folder, not a log", param_hint="LOG")
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
            raise typer.BadParameter(
                f"{log}: is a device or socket, not a log file: name a file, or pipe the log in ('-')",
                param_hint="LOG",
            )
        if st.st_size > MAX_LOG_BYTES:
            raise typer.BadParameter(_too_big(log, st.st_size), param_hint="LOG")
        with open(log, "rb") as f:
            data = _read_capped(f, log)
    except OSError as exc:
        raise typer.BadParameter(f"{log}: {exc.strerror or exc}", param_hint="LOG") from None
    return _decode(data), log


def _read_capped(stream: BinaryIO, name: str) -> bytes:
    """All of `stream`, or a usage error naming it once more than MAX_LOG_BYTES have come (a file that grows while
    read, an endless pipe)."""
    chunks: list[bytes] = []
    size = 0
    while chunk := stream.read(_CHUNK):
        size += len(chunk)
        if size > MAX_LOG_BYTES:
            raise typer.BadParameter(_too_big(name, size, more=True), param_hint="LOG")
        chunks.append(chunk)
    return b"".join(chunks)


def _too_big(name: str, size: int, *, more: bool = False) -> str:
    mib = MAX_LOG_BYTES >> 20
    has = f"more than {mib} MiB" if more else f"{size / (1 << 20):.0f} MiB"
    return f"{name}: {has}, over the {mib} MiB a log may be: pass the part with the nccl-tests run (grep, tail)"


def _decode(data: bytes) -> str:
    # Logs mix in whatever the job printed: undecodable bytes are replaced, never a reason to refuse the log.
    return data.decode("utf-8", errors="replace")


def _write(path: Path, data: bytes) -> None:
    """OutputError naming the path when it cannot be written; STDOUT is written to stdout."""
    if path is STDOUT:
        try:
            sys.stdout.write(data.decode())
            sys.stdout.flush()
        except OSError as exc:
            raise OutputError(f"stdout: cannot write the report: {exc.strerror or exc}") from None
        return
    write_file(path, data, what="the report")


def render(rep: "Report", console: "Console") -> None:
    """The report for a terminal: what ran, one row per criterion, the large sizes against the published figures,
    the note on 'Avg bus bandwidth', and the verdict."""
    from rich.table import Table
    from rich.text import Text

    from imgbuild.nccltests.verdict import human_size

    parsed = rep.log
    console.print(Text(f"nccl-tests report: {rep.source}", style="bold"))
    shape = [
        f"instance type {rep.instance_type or 'unknown'} ({rep.instance_type_from})",
        f"{rep.nodes if rep.nodes is not None else '?'} node{'' if rep.nodes == 1 else 's'} ({rep.nodes_from})",
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
