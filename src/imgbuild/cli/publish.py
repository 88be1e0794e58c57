"""`imgbuild push` (imgbuild.publish) and `imgbuild matrix` (imgbuild.publish.matrix): publishing images and the
CI matrix that drives it."""

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from imgbuild.cli.console import err, handled, out, platform_archs, resolved
from imgbuild.core.errors import ImgbuildError
from imgbuild.core.interrupts import terminable

if TYPE_CHECKING:
    from imgbuild.publish.results import PublishResult


def register(app: typer.Typer) -> None:
    """Add `push` and `matrix` to `app`."""
    app.command("push")(push)
    app.command("matrix")(matrix_)


def _registry_value(value: str | None) -> str | None:
    """--registry / IMGBUILD_REGISTRY must be HOST[/PREFIX] without credentials: else a usage error (exit 2) before
    anything is contacted, naming no part of a password."""
    if value is None:
        return None
    from imgbuild.core.errors import PushError
    from imgbuild.publish.registry import parse_registry

    try:
        parse_registry(value)
    except PushError as exc:
        raise typer.BadParameter(str(exc)) from None
    return value


def _scan_level(value: str | None) -> str | None:
    """--scan-gate LEVEL, any case: one of INFORMATIONAL, LOW, MEDIUM, HIGH, CRITICAL (else a usage error, exit 2)."""
    if value is None:
        return None
    from imgbuild.publish.scan import LEVELS

    if value.upper() not in LEVELS:
        raise typer.BadParameter(f"{value!r}: expected one of {', '.join(LEVELS)}")
    return value.upper()


@handled
@terminable
def push(
    what: Annotated[
        str, typer.Argument(metavar="RECIPE|IMAGE", help="A recipe (its lock-derived tags) or a local image.")
    ],
    registry: Annotated[
        str | None,
        typer.Option(
            "--registry",
            "-r",
            envvar="IMGBUILD_REGISTRY",
            metavar="HOST[/PREFIX]",
            callback=_registry_value,
            help="Registry host and optional path prefix, e.g. 127.0.0.1:5000/team. With --ecr it may be left "
            "out: your account's ECR registry in the current region.",
        ),
    ] = None,
    ecr: Annotated[
        bool,
        typer.Option(
            "--ecr",
            help="Amazon ECR: credentials from the AWS credential chain, repositories created when missing "
            "(immutable tags, scan on push). Implied by a <account>.dkr.ecr.<region>.amazonaws.com host.",
        ),
    ] = False,
    immutable: Annotated[
        bool | None,
        typer.Option(
            "--immutable/--mutable",
            help="Check the registry's digest for each tag first: the same image is 'already published', "
            "another one a failure. Default: on for immutable ECR repositories, off elsewhere.",
        ),
    ] = None,
    retries: Annotated[
        int, typer.Option("--retries", min=1, max=10, help="Tries per tag on transient registry errors.")
    ] = 4,
    scan_gate: Annotated[
        str | None,
        typer.Option(
            "--scan-gate",
            metavar="LEVEL",
            callback=_scan_level,
            help="ECR only: push the content-addressed tag, wait for ECR's scan of its digest, and fail (exit 17) on "
            "findings at or above LEVEL (INFORMATIONAL < LOW < MEDIUM < HIGH < CRITICAL; an unrated finding without "
            "a CVSS score counts at every level) that are not allowed, or when the scan gives no verdict (FAILED, "
            "unsupported, --scan-timeout). Only a passed gate pushes the readable tags; a failed one removes the tag "
            "this run pushed.",
        ),
    ] = None,
    allow: Annotated[
        list[str] | None,
        typer.Option("--allow", metavar="ID", help="A finding (CVE-..., GHSA-...) the gate lets through; repeatable."),
    ] = None,
    allow_file: Annotated[
        list[Path] | None,
        typer.Option(
            "--allow-file",
            metavar="FILE",
            help="Allowed findings, one ID per line followed by `# why` (the reason is required); repeatable.",
        ),
    ] = None,
    scan_timeout: Annotated[
        float,
        typer.Option("--scan-timeout", metavar="SECONDS", min=1, help="How long to wait for the scan's verdict."),
    ] = 1800.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")] = False,
    sbom_path: Annotated[
        Path | None,
        typer.Option(
            "--sbom",
            metavar="FILE",
            help="RECIPE only: write the pushed image's CycloneDX SBOM here (as `imgbuild sbom`, naming the image by "
            "the registry's manifest digests).",
        ),
    ] = None,
    platform: Annotated[
        list[str] | None,
        typer.Option(
            "--platform",
            callback=platform_archs,
            help="RECIPE only, repeatable: which architectures to publish (default: every one its platform.arch "
            "lists). Several are published as an OCI image index under the plain tags, each architecture's image "
            "under <tag>-<arch>; one alone is pushed as that image under the tags the engine holds it by.",
        ),
    ] = None,
) -> None:
    """Re-tag an image under a registry and push it; prints the pushed digest of every tag.

    With --scan-gate (ECR): exit 17 when the scan gate does not pass, after listing each finding (id, severity,
    package, version, uri) and the allowed ones.
    """
    from imgbuild.publish import command, source
    from imgbuild.publish.results import PublishResult
    from imgbuild.publish.retry import Retry
    from imgbuild.ui.progress import push_progress_for

    is_recipe = source.is_recipe(what)
    if sbom_path is not None and not is_recipe:
        raise typer.BadParameter(f"{what!r} is not a recipe: the SBOM needs its lock", param_hint="--sbom")
    # A recipe is read once, here (its lock: exit 4 when missing), and its images' names handed down.
    res, recipe, arches = None, None, None
    if is_recipe:
        loaded, res = resolved(what)
        recipe = source.recipe(loaded, res)
        arches = recipe.identity.arches
    selected = platform or list(arches or ())
    if sbom_path is not None and arches is not None and (len(selected) > 1 or selected[0] != arches[0]):
        raise typer.BadParameter(
            f"the SBOM describes the image of {what}'s first architecture, linux/{arches[0]}; this push is "
            f"{', '.join('linux/' + a for a in selected)}",
            param_hint="--sbom",
        )
    gate = None
    if scan_gate is not None:
        from imgbuild.publish.scan import AllowList, ScanGate

        gate = ScanGate(scan_gate, AllowList.build(allow or (), allow_file or ()), timeout_s=scan_timeout)
    elif allow or allow_file:
        raise typer.BadParameter("--allow and --allow-file go with --scan-gate LEVEL", param_hint="--allow")
    try:
        result = command.publish(
            recipe or what,
            registry,
            ecr=ecr,
            immutable=immutable,
            retry=Retry(attempts=retries),
            progress=push_progress_for(err()),
            gate=gate,
            arches=platform,
        )
    except ImgbuildError as exc:
        failed = getattr(exc, "result", None)  # scan.ScanGateFailed: what was pushed, and the gate's report
        if isinstance(failed, PublishResult):
            _print_result(failed, as_json)
        raise
    _print_result(result, as_json)
    if sbom_path is not None and res is not None and recipe is not None:
        from imgbuild.publish import inventory

        made = inventory.after_push(res, recipe.identity, result, sbom_path)  # the identity the push named it by
        for warning in made.warnings:
            err().print(f"imgbuild: warning: {warning}", markup=False)
        err().print(f"wrote {sbom_path}: the SBOM of {made.image} ({made.image_id[:19]})", markup=False)


def _print_result(result: "PublishResult", as_json: bool) -> None:
    for warning in result.warnings:
        err().print(f"imgbuild: warning: {warning}", markup=False)
    if as_json:
        sys.stdout.write(json.dumps(result.to_json(), indent=2) + "\n")
        return
    for ref in result.refs:
        size = f"  size {ref.size}" if ref.size is not None else ""
        out().print(f"{ref.status}: {ref.target}  {ref.digest}{size}", markup=False)
    if result.index is not None:
        index = result.index
        for ref in index.refs:
            out().print(f"{ref.status}: {ref.target}  {ref.digest}  (image index)", markup=False)
        out().print(f"index {index.digest} ({index.media_type}):", markup=False)
        for entry in index.manifests:
            out().print(f"  {entry.platform}  {entry.digest}  image {entry.image_id[:19]}", markup=False)
    if result.scan is not None:
        for line in result.scan.lines():
            out().print(line, markup=False)


@handled
def matrix_(
    recipes: Annotated[
        list[str] | None, typer.Argument(help="Only these recipes (default: every shipped recipe).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One line of JSON for a GitHub Actions matrix.")] = False,
) -> None:
    """The buildable recipes with their tags and runners, for a CI job matrix."""
    from imgbuild.publish import matrix

    data = matrix.matrix(recipes or None)
    if as_json:
        sys.stdout.write(json.dumps(data, separators=(",", ":")) + "\n")
        return
    for row in data["include"]:
        out().print(f"{row['recipe']:<12} {row['runner']:<20} {row['image']}:{','.join(row['tags'])}", markup=False)
