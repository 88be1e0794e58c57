"""`imgbuild run RECIPE [--print] [-- CMD ...]`: a container of the recipe's image with its runtime profile.

The docker CLI runs it (an interactive session is exactly what `docker run -it` gives), adapted to this host and
engine (`runprofile.for_host`). `--print` prints the command for the recipe's target host instead (its runtime, its
GPUs, its instance type's EFA devices: `runprofile.target_spec`), to paste there, with a note on stderr for each thing
this host would drop and why.
"""

import shutil
import signal
import subprocess
import sys
from typing import Annotated

import typer

from imgbuild.cli.console import RecipeArg, err, handled, out, resolved, warn
from imgbuild.core import validate
from imgbuild.core.errors import EngineError


def register(app: typer.Typer) -> None:
    """Add the `run` command to `app`."""
    app.command("run")(run)


@handled
def run(
    ref: RecipeArg,
    cmd: Annotated[
        list[str] | None,
        typer.Argument(help="Command to run in the container, after `--` (default: the image's, a shell)."),
    ] = None,
    print_only: Annotated[
        bool,
        typer.Option(
            "--print",
            help="Print the docker command for the recipe's target host instead of running it (stderr notes what "
            "this host would drop).",
        ),
    ] = False,
    image: Annotated[
        str | None,
        typer.Option(
            "--image",
            callback=validate.option(validate.image_ref),
            help="Image reference to run (default: the recipe's lock tag).",
        ),
    ] = None,
) -> None:
    """Run a container of a recipe's image with its runtime profile (devices, runtime, limits)."""
    from imgbuild.cluster.jobplan import target_instance
    from imgbuild.engine import runprofile
    from imgbuild.image import identity

    _, res = resolved(ref)
    warn(res)
    named = identity.of(res)  # read once: the reference and the run profile (the image's manifest) name it
    image_ref = image or named.ref()
    # What the engine and host cannot give (a GPU request without the nvidia runtime, a runtime it lacks) is left
    # out with a note, as verify does (runprofile.for_host); an engine that can't be asked gets the whole profile.
    # --print: the target host's line, whole, and a note for what this host would drop (runprofile.target_spec).
    runtimes = runprofile.engine_runtimes()
    notes: list[str] = []
    argv = runprofile.docker_run_args(
        res,
        image_ref,
        cmd or [],
        host_devices=runprofile.host_efa_devices(),
        interactive=sys.stdin.isatty(),
        engine=None if runtimes is None else (runtimes, runprofile.host_has_gpu()),
        notes=notes,
        target=print_only,
        target_host=target_instance(res.recipe) if print_only else None,
        named=named,
    )
    for note in notes:
        err().print(f"note: {note}", markup=False, highlight=False)
    if print_only:
        out().print(runprofile.command_line(argv), markup=False, emoji=False, highlight=False)
        return
    raise typer.Exit(_docker(argv, image_ref, res.name))


def _docker(argv: list[str], image_ref: str, recipe_name: str) -> int:
    """Run the docker CLI in the foreground; its exit status (the container's) becomes ours."""
    if shutil.which(argv[0]) is None:
        raise EngineError("the docker command line is not installed", hint="`imgbuild run --print` shows the command")
    probe = subprocess.run(
        [argv[0], "image", "inspect", "--format", "{{.Id}}", image_ref], capture_output=True, text=True, check=False
    )
    if probe.returncode != 0:
        detail = probe.stderr.strip()
        if "no such image" in detail.lower():
            raise EngineError(f"no image {image_ref} in the engine", hint=f"build it: imgbuild build {recipe_name}")
        raise EngineError(f"docker image inspect {image_ref} failed: {detail or probe.returncode}")
    # Ctrl-C belongs to the container: docker forwards it (or the terminal does, with -t); we wait for the end.
    # A handler, not SIG_IGN: an ignored signal would stay ignored in docker after exec, a handler does not.
    previous = signal.signal(signal.SIGINT, lambda *_: None)
    try:
        return subprocess.run(argv, check=False).returncode
    finally:
        signal.signal(signal.SIGINT, previous)
