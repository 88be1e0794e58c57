"""app: the user's own layer on top of any target (`extends: pytorch`, `extends: a100`): their Python requirements,
pinned by hash at `imgbuild lock`; packages built from source against the image's stack (its one NCCL, its MPI, its
torch); OS packages; their code; and the program `train` runs by default.

The user's layer comes after the stack's (its own stages, `final` in app.j2): a change to the code or the requirements
rebuilds only it. Its pin holds what the recipe decided (names, paths); the versions and hashes are the lock's content
(requirement sets `app`, `app/build`, `app/source`).
"""

from __future__ import annotations

import posixpath
import re
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator

from imgbuild import probes
from imgbuild.blocks._block import Block, PythonSets, UserCode
from imgbuild.blocks._core import Context, Contribution, Details, Pin, Resolution
from imgbuild.blocks.app.code import ALWAYS_IGNORED, AppCode, RelPath, code_digest, code_files, ignored
from imgbuild.blocks.python import require_venv
from imgbuild.checks import CheckContext, check, fail, passed, skip
from imgbuild.checks.results import CheckResult
from imgbuild.core import files
from imgbuild.core.fields import DebPackage, EnvName, Strict, Text, matching, one_line
from imgbuild.core.versions import same_version

CODE_CONTEXT = "imgbuild/app/code"  # the code folder's files in the build context
WHEELS_DIR = "/tmp/imgbuild-app-wheels"  # the build stage's wheels, bind-mounted into the image's install
DEFAULT_BUILD_REQUIREMENTS = ("setuptools>=70.1",)
MAX_PYPROJECT_BYTES = 1 << 20


def requirement(value: str) -> str:
    """A PEP 508 requirement the lock can pin from the index: a name, extras, a version specifier, markers."""
    from packaging.requirements import InvalidRequirement, Requirement  # here: its parser is 20 ms of start-up

    one_line(value)
    if value.lstrip().startswith("-"):
        raise ValueError(
            f"expected a requirement such as transformers==4.46.3, got the pip option {value!r} "
            "(the index is uv's, as configured; hashes are the lock's)"
        )
    try:
        req = Requirement(value)
    except InvalidRequirement as exc:
        raise ValueError(f"expected a requirement such as transformers==4.46.3 (PEP 508): {exc}") from None
    if req.url:
        raise ValueError(f"{value!r} is a direct reference (name @ URL): the lock pins releases of the index by hash")
    return value


PipRequirement = Annotated[str, AfterValidator(requirement)]
# PEP 508's name: what a requirement, from_source and a code folder's pyproject.toml may name.
DIST_NAME = r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?"
DistName = Annotated[str, AfterValidator(matching(DIST_NAME, "a distribution name such as horovod"))]
ModuleName = Annotated[
    str, AfterValidator(matching(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", "a module name (pkg.mod)"))
]
# A path inside the recipe's folder or the code folder: plain characters, relative.


def parse_requirements(text: str, where: str) -> list[str]:
    """The requirements of a requirements file's text (one per line; blank lines and # comments skipped, a trailing
    comment cut); ValueError naming `where:LINE` for anything else (pip options, direct references)."""
    out = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = re.sub(r"(^|\s)#.*$", "", raw).strip()
        if not line:
            continue
        try:
            out.append(requirement(line))
        except ValueError as exc:
            raise ValueError(f"{where}:{number}: {exc}") from None
    return out


class App(Strict):
    """The user's layer: requirements, source builds, OS packages, code, the default program."""

    requirements: tuple[PipRequirement, ...] = ()
    """Python requirements (`transformers==4.46.3`, `einops`), or the name of a requirements file beside the recipe (one
    per line, # comments): `imgbuild lock` resolves them with uv for the image's Python and platform into exact
    versions with hashes, with every distribution the stack pins (torch, numpy, the NCCL wheel, boto3...) and every
    one it brings otherwise (Debian's mpi4py) as constraints: a requirement that would change one is refused, naming
    both versions."""
    # `requirements: FILE` as the loader read it: FILE's name (relative to the recipe that names it); its lines are
    # `requirements` (part of the recipe's digest: an edited file makes the lock stale).
    requirements_file: RelPath | None = None
    from_source: tuple[DistName, ...] = ()
    """Names among the requirements built from their sdists in a build stage (pip wheel --no-build-isolation): they
    compile against the image's torch, NCCL and MPI, never a wheel built elsewhere (Horovod's way)."""
    build_requirements: tuple[PipRequirement, ...] = ()
    """What those builds import (setuptools>=70.1 when left out and something is built), hashed too; installed in the
    build stage only."""
    build_packages: tuple[DebPackage, ...] = ()
    """Debian packages the build stage needs besides build-essential, python3-dev and the MPI headers."""
    build_env: dict[EnvName, Text] = {}
    """Variables for the builds (HOROVOD_GPU_OPERATIONS: NCCL...), after the stack's own (NCCL_HOME, NCCL_INCLUDE_DIR,
    NCCL_LIB_DIR, MPICC, MPICXX, CUDA_HOME, TORCH_CUDA_ARCH_LIST)."""
    packages: tuple[DebPackage, ...] = ()
    """Debian packages for the image, installed in the user's layer."""
    code: AppCode | None = None
    program: RelPath | None = None
    """What `train` runs when the job names no program (SageMaker's sagemaker_program): a file in the code folder."""
    imports: tuple[ModuleName, ...] = ()
    """Modules `imgbuild verify` imports besides those of the requirements."""


class AppDetails(Details):
    """The app pin: what the recipe decided. `requirements` are the distributions the user named (normalized),
    `from_source` those built against the image, `package` the code folder's own distribution (code.install),
    `program` train's default program (an absolute path when the code is in the image)."""

    requirements: tuple[str, ...] = ()
    from_source: tuple[str, ...] = ()
    code_path: str | None = None
    package: str | None = None
    program: str | None = None
    imports: tuple[str, ...] = ()

    @property
    def program_path(self) -> str | None:
        return self.program


def _names(lines: tuple[str, ...]) -> list[str]:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    return [canonicalize_name(Requirement(line).name) for line in lines]


def project_name(folder: Path) -> str:
    """The distribution name of the Python project in `folder` (its pyproject.toml's [project] name), checked like a
    recipe's requirement names: it reaches the Dockerfile and verify's probes."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib

    pyproject = folder / "pyproject.toml"
    if not pyproject.exists() and not pyproject.is_symlink():
        raise ValueError(f"{pyproject}: missing (code.install builds the folder as a pyproject.toml project)")
    try:
        files.inside(folder, pyproject)
        data = tomllib.loads(files.read_text_bounded(pyproject, MAX_PYPROJECT_BYTES))
    except files.Refused as exc:
        raise ValueError(f"cannot read it: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{pyproject}: not TOML: {exc}") from None
    name = data.get("project", {}).get("name") if isinstance(data.get("project"), dict) else None
    if not isinstance(name, str) or not name:
        raise ValueError(f"{pyproject}: no [project] name (code.install needs one: verify imports the package)")
    if re.fullmatch(DIST_NAME, name, re.ASCII) is None:
        raise ValueError(
            f"{pyproject}: [project] name: expected a distribution name (PEP 508: letters, digits and . _ -, "
            f"starting and ending with a letter or a digit), got {name[:80]!r}"
        )
    from packaging.utils import canonicalize_name

    return canonicalize_name(name)


def _app(ctx: Context) -> App:
    app = ctx.resolved.recipe.app
    assert app is not None  # the pin exists only with the section
    return app


def requirements(pin: Pin, ctx: Context) -> dict[str, list[str]]:
    """`app`: the requirements installed as wheels; `app/build`: what the source builds import (the build stage
    only); `app/source`: the requirements built from their sdists (`--no-binary`), with their own dependencies.
    Resolved in that order, each after the stack's sets (pin.wheels): what the stack pins constrains all three."""
    app = _app(ctx)
    details = pin.typed(AppDetails)
    source = set(details.from_source)
    lines = app.requirements
    binary = [line for line, name in zip(lines, details.requirements, strict=True) if name not in source]
    built = [line for line, name in zip(lines, details.requirements, strict=True) if name in source]
    sets: dict[str, list[str]] = {}
    if binary:
        sets["app"] = binary
    if built or details.package:
        sets["app/build"] = list(app.build_requirements or DEFAULT_BUILD_REQUIREMENTS)
    if built:
        sets["app/source"] = [f"--no-binary={','.join(sorted(source))}", *built]
    return sets


def build_packages(ctx: Context) -> list[str]:
    """The Debian packages of the build stage: compilers, Python's headers, the MPI's headers where the image's MPI
    is the distribution's, and the recipe's own."""
    pkgs = {"build-essential", "python3-dev", *_app(ctx).build_packages}
    mpi = ctx.pin("openmpi")
    if mpi is not None and mpi.source == "distro":
        pkgs.add("libopenmpi-dev")
    return sorted(pkgs)


def build_env(ctx: Context) -> dict[str, str]:
    """What a source build sees of the image's stack (exported in its RUN), then the recipe's build_env: the one
    NCCL's folders, the MPI's compiler wrappers, CUDA's home and the GPU architecture for torch's extensions."""
    env: dict[str, str] = {}
    nccl = ctx.prefix("nccl")
    if nccl:
        env |= {"NCCL_HOME": nccl, "NCCL_INCLUDE_DIR": f"{nccl}/include", "NCCL_LIB_DIR": f"{nccl}/lib"}
    mpi = ctx.pin("openmpi")
    if mpi is not None:
        prefix = ctx.prefix("openmpi")
        wrappers = f"{prefix}/bin/" if prefix and mpi.source != "distro" else ""
        env |= {"MPICC": f"{wrappers}mpicc", "MPICXX": f"{wrappers}mpicxx"}
    if ctx.cuda_home:
        env["CUDA_HOME"] = ctx.cuda_home
    cuda = _cuda_include(ctx)
    if cuda:
        env["CUDA_INCLUDE_DIR"] = cuda
    # nccl.h includes cuda_runtime.h: a build that knows neither variable still finds both through the compiler's path
    includes = [p for p in (f"{nccl}/include" if nccl else None, cuda) if p]
    if includes:
        env["CPATH"] = ":".join(includes)
    gpu = ctx.resolved.recipe.platform.gpu_arch
    if gpu:
        digits = gpu.removeprefix("sm_")
        env["TORCH_CUDA_ARCH_LIST"] = f"{digits[:-1]}.{digits[-1]}"
    return {**env, **_app(ctx).build_env}


def _cuda_include(ctx: Context) -> str | None:
    """CUDA's headers in the image: the toolkit's (CUDA_HOME; the NVIDIA targets copy it into the build stage). A
    stack of CUDA wheels alone (`pytorch`) has no complete set: nvidia-cuda-runtime's include/ lacks crt/, which
    nvcc's wheel brings (add it to app.build_requirements)."""
    return f"{ctx.cuda_home}/include" if ctx.cuda_home else None


# The requirement sets of the user's layer that reach the image (app/build stays in its build stage).
IMAGE_SETS = ("app", "app/source")


class AppBlock(Block, PythonSets, UserCode):
    name = "app"
    options = App
    modes = {"recipe": "fragment"}
    details = AppDetails
    requirements_stage = "runtime"
    top_level = True
    after = ("python", "pytorch", "mpi4py", "nccl", "openmpi", "sagemaker")
    template_globals = {
        "app_sets": requirements,
        "app_build_packages": build_packages,
        "app_build_vars": lambda ctx: " ".join(f"{k}={shlex.quote(v)}" for k, v in build_env(ctx).items()),
        "app_paths": lambda: {"code_context": CODE_CONTEXT, "wheels": WHEELS_DIR},
    }

    def resolve(self, app: App, rs: Resolution) -> Pin:
        from packaging.utils import canonicalize_name

        lines = app.requirements
        names = _names(lines)
        builds = bool(app.from_source) or (app.code is not None and app.code.install)
        if lines or builds:
            require_venv(rs)
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise rs.fail("app.requirements", f"named more than once: {', '.join(twice)}")
        source = [canonicalize_name(n) for n in app.from_source]
        missing = [n for n in source if n not in names]
        if missing:
            raise rs.fail(
                "app.from_source",
                f"{', '.join(missing)} not among app.requirements: name the release to build there "
                f"(e.g. {missing[0]}==VERSION)",
            )
        if app.program is not None and rs.options("sagemaker") is None:
            raise rs.fail(
                "app.program", "the default program is train's (components.sagemaker), which this recipe lacks"
            )
        package = None
        code_path = None
        program = app.program
        if app.code is not None:
            folder = app.code.folder
            code_path = app.code.path
            if app.code.install:
                try:
                    package = project_name(folder)
                except ValueError as exc:
                    raise rs.fail("app.code.install", str(exc)) from None
                if package in names:
                    raise rs.fail(
                        "app.code.install", f"the code folder's project {package} is also in app.requirements"
                    )
            if program is not None:
                try:
                    files.inside(folder, folder / program)
                except files.Refused as exc:
                    raise rs.fail("app.program", f"{program!r} is not in the code folder: {exc}") from None
                if not (folder / program).is_file():
                    raise rs.fail("app.program", f"{program!r} is not a file in the code folder {folder}")
                program = posixpath.normpath(program)
                if ignored(app.code).match_file(program):
                    raise rs.fail(
                        "app.program",
                        f"{program!r} is left out of the image by app.code.ignore (or the files always left out: "
                        f"{', '.join(ALWAYS_IGNORED)})",
                    )
                program = f"{code_path.rstrip('/')}/{program}"
        details = AppDetails(
            requirements=tuple(names),
            from_source=tuple(source),
            code_path=code_path,
            package=package,
            program=program,
            imports=tuple(app.imports),
        )
        return Pin(version=None, source="recipe", origin="recipe", details=details)

    def contribute(self, pin: Pin, ctx: Context) -> Contribution:
        return Contribution(name="app")

    def requirements(self, pin: Pin, ctx: Context) -> Mapping[str, list[str]]:
        return requirements(pin, ctx)

    def context(self, pin: Pin, ctx: Context) -> list[tuple[str, bytes, int]]:
        app = _app(ctx)
        if app.code is None:
            return []
        return [(f"{CODE_CONTEXT}/{rel}", data, mode) for rel, data, mode in code_files(app.code)]

    def image_digest(self, pin: Pin, resolved: Any) -> str | None:
        app = resolved.recipe.app
        return code_digest(app.code if app is not None else None)

    def manifest_entry(self, pin: Pin, resolved: Any, image_digest: str | None) -> dict[str, Any]:
        """The manifest's `app` (imgbuild.image.manifest.AppEntry): the versions the lock gives the user layer's
        distributions, and its code's digest (`image_digest`: code_digest, as render read it)."""
        python = resolved.content.python if resolved.content is not None else {}
        dists = {r.name: r.version for name in IMAGE_SETS for r in python.get(name, ())}
        return {"distributions": dict(sorted(dists.items())), "code_digest": image_digest}


BLOCK = AppBlock()


# ---- verify


def _expected(ctx: CheckContext) -> dict[str, Any]:
    """The manifest's `app` entry (the lock's, where verify has one): distributions, built ones, the code's digest."""
    manifest = ctx.expected_manifest or ctx.manifest or {}
    return manifest.get("app") or {}


@check("app-distributions", "app")
def app_distributions(ctx: CheckContext) -> CheckResult:
    """Every distribution the user's layer installs (requirements, their dependencies, the source builds, the code's
    package) is installed at the lock's version."""
    want: dict[str, str] = _expected(ctx).get("distributions") or {}
    if not want:
        return skip("the app installs no Python distribution", expected="")
    import json

    data, ran = ctx.python_json(probes.text("app_dists.py"), json.dumps(sorted(want)))
    expected = f"{len(want)} distributions at the lock's versions"
    if data is None:
        return fail(f"reading the installed versions: {ran.why()}", expected)
    wrong = [
        f"{name} {data.get(name) or 'missing'} (lock: {version})"
        for name, version in sorted(want.items())
        if data.get(name) is None or not same_version(data[name], version)
    ]
    if wrong:
        return fail("; ".join(wrong), expected, f"{len(want) - len(wrong)} of {len(want)} as locked")
    return passed(expected, ", ".join(f"{n}=={v}" for n, v in sorted(want.items())))


def _import_probe(ctx: CheckContext) -> tuple[Any, Any]:
    import json

    details = ctx.details("app")
    dists = [*details.requirements, *([details.package] if details.package else [])]
    built = [*details.from_source, *([details.package] if details.package else [])]
    return ctx.once(
        "app-imports",
        lambda: ctx.python_json(
            probes.text("app_imports.py"),
            json.dumps(dists),
            json.dumps(list(details.imports)),
            json.dumps(built),
            timeout_s=180,
        ),
    )


@check("app-imports", "app")
def app_imports(ctx: CheckContext) -> CheckResult:
    """The user's packages import in the image's Python: each named requirement's top-level modules, the code's
    package and the recipe's `imports`."""
    details = ctx.details("app")
    if not details.requirements and not details.package and not details.imports:
        return skip("the app names no package to import", expected="")
    data, ran = _import_probe(ctx)
    expected = "every module imports"
    if data is None:
        return fail(f"the import probe: {ran.why()}", expected)
    if data["errors"]:
        found = "; ".join(f"{m}: {e}" for m, e in sorted(data["errors"].items()))
        return fail(f"{len(data['errors'])} module(s) do not import", expected, found)
    return passed(expected, ", ".join(data["ok"]))


@check("app-built-links", "app")
def app_built_links(ctx: CheckContext) -> CheckResult:
    """What was built from source against the image loads, and links the image's one NCCL and its MPI: after importing
    it, every libnccl and libmpi in the process's memory map is the image's (its NCCL: the nccl pin's library; its MPI:
    the MPI the image's mpicc links), and each compiled extension of those distributions resolves them there (ldd)."""
    details = ctx.details("app")
    built = [*details.from_source, *([details.package] if details.package else [])]
    if not built:
        return skip("nothing is built from source", expected="")
    data, ran = _import_probe(ctx)
    expected = "the image's NCCL and MPI"
    if data is None:
        return fail(f"the import probe: {ran.why()}", expected)
    failed = {m: e for m, e in data["errors"].items() if any(m in data["modules"].get(d, []) for d in built)}
    if failed:
        return fail("; ".join(f"{m}: {e}" for m, e in failed.items()), expected, "does not load")
    # The image's own copies: the nccl pin's library, the MPI's under its prefix, and what the loader's cache lists.
    globs = [
        f"{p}/lib/{lib}.so*" for p, lib in ((ctx.prefix("nccl"), "libnccl"), (ctx.prefix("openmpi"), "libmpi")) if p
    ]
    image = ctx.run(
        f"for f in {' '.join(globs)} $(ldconfig -p 2>/dev/null | awk '/libnccl[.]so|libmpi[.]so/ {{print $NF}}'); "
        'do [ -e "$f" ] && readlink -f "$f"; done; true'
    )
    allowed = {line.strip() for line in image.out.splitlines() if line.strip()}
    loaded = data["libs"]
    foreign = [f"{lib}: {path}" for lib, found in loaded.items() for path in found if path not in allowed]
    if len(loaded.get("libnccl", [])) > 1 or len(loaded.get("libmpi", [])) > 1:
        return fail(f"two copies of one library loaded: {loaded}", expected, str(loaded))
    exts = [so for files in data["extensions"].values() for so in files]
    bad: list[str] = []
    for so in exts:
        ldd = ctx.run(f"ldd {shlex.quote(so)}")
        for line in ldd.out.splitlines():
            m = re.match(r"\s*(libnccl\.so\S*|libmpi\.so\S*) => (\S+)", line)
            if m is None:
                continue
            if m.group(2) == "not":
                bad.append(f"{so}: {m.group(1)} not found")
                continue
            real = ctx.run(f"readlink -f {shlex.quote(m.group(2))}").out.strip()
            if real not in allowed:
                bad.append(f"{so}: {m.group(1)} => {real}")
    found = ", ".join(f"{lib} {p}" for lib, paths in sorted(loaded.items()) for p in paths) or "neither loaded"
    if foreign or bad:
        return fail("; ".join([*foreign, *bad]), expected, found)
    return passed(expected, found, extensions=exts)


@check("app-code", "app")
def app_code(ctx: CheckContext) -> CheckResult:
    """The code is where the recipe says, exactly the files the recipe's folder gave (the digest render computed),
    and the default program is there."""
    details = ctx.details("app")
    if details.code_path is None:
        return skip("the app has no code folder (the job brings it: source_dir)", expected="")
    want = _expected(ctx).get("code_digest")
    import json

    probe = f"<<'IMGBUILD_EOF'\n{codetree_source()}\nIMGBUILD_EOF"
    ran = ctx.run(f"{shlex.quote(ctx.python)} - {shlex.quote(details.code_path)} {probe}")
    lines = [line for line in ran.out.splitlines() if line.startswith("{")]
    expected = f"{details.code_path} (digest {str(want)[:12]})"
    if not ran.ok or not lines:
        return fail(f"reading {details.code_path}: {ran.why()}", expected)
    data = json.loads(lines[-1])
    if data.get("missing"):
        return fail(f"{details.code_path} is not a folder in the image", expected, "missing")
    if want and data["digest"] != want:
        return fail(
            f"the code in {details.code_path} is not the code the image was rendered with",
            expected,
            data["digest"][:12],
        )
    if details.program and details.program.startswith("/"):
        there = ctx.run(f"test -f {shlex.quote(details.program)}")
        if not there.ok:
            return fail(f"the default program {details.program} is missing", expected, "no program")
    return passed(expected, f"{data['files']} files, digest {data['digest'][:12]}")


def codetree_source() -> str:
    return probes.text("codetree.py")
