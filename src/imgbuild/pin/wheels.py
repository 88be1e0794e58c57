"""Every Python distribution an image installs, pinned by content: the closure of each requirement set
(`Block.requirements`) with the sha256 of the files the target may install, resolved by uv at `imgbuild lock`.

uv resolves for the target, not for this machine: `--python-version` is the image's Python (the `python` pin) and
`--python-platform <machine>-manylinux_2_XX` its CPU and C library (core.distro.DISTRO's glibc), so the recorded hashes
are those of the files pip on the target can pick (uv's pylock.toml output names every file with its hash; the wheels
incompatible with the target are left out). A recipe built for several architectures (platform.arch) resolves each
set for each of them: the versions must agree, and a requirement holds the hashes of every architecture's files
(pip --require-hashes takes the one it installs). uv reads the one index imgbuild reads (`pypi.index_url`:
IMGBUILD_INDEX_URL, else pip's configuration), handed to it as its default index (`uv_index`): uv's own index settings
(uv.toml, UV_INDEX, UV_DEFAULT_INDEX, UV_INDEX_URL, UV_EXTRA_INDEX_URL) are not read, so the releases `show` and
`outdated` name and the closures `lock` hashes come from the same place.

Sets resolve in install order (`install_order`: the builder stage's sets, then the runtime stage's, each stage in
the order given): a later set is compiled with the earlier sets' pins as constraints and keeps only
what they do not hold, so each set installs with --no-deps and the sets together hold every distribution the image
installs, transitive ones included. A set's entry `--no-binary=NAME` (pip's own requirements-file option) says that
NAME installs from its sdist (mpi4py, compiled against the image's MPI): its record is the sdist's hash alone.

An existing lock's versions are preferences, as uv and pip-tools keep the pins of an existing output file: each set
is compiled with them written where uv reads its previous output (`--output-file`), so a distribution keeps its
locked version while that version still resolves and fits the set, whatever the index has published since; only its
hashes are read again (the same version served with other bytes is drift, not a newer release). A release the index
has yanked since stays preferred (uv keeps a yanked pin, as pip installs a release pinned exactly) and is reported
(`Yank`).
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from imgbuild.core import platforms
from imgbuild.core.distro import DISTRO
from imgbuild.core.errors import IndexLookupError, ResolveError
from imgbuild.core.versions import same_version
from imgbuild.pin.content import Requirement
from imgbuild.pin.resolver import Resolved

UV_TIMEOUT_S = 600  # one set's resolution; torch's closure takes seconds with a warm uv cache
UV_HTTP_TIMEOUT_S = 30  # uv's own default for one request (UV_HTTP_TIMEOUT)
_NO_BINARY = re.compile(r"^--no-binary(?:=|\s+)(\S+)$")
# uv's warning for a yanked release it resolved to (a preference, an exact pin): `name==version` is yanked (reason: ..)
_YANKED = re.compile(r"^warning: `([^`=]+)==([^`]+)` is yanked(?: \(reason: (.*)\))?\s*$", re.MULTILINE)


class Yank(NamedTuple):
    """A distribution a set resolved to although the index has yanked that release (PEP 592)."""

    set: str
    name: str
    version: str
    reason: str


def no_binary(specifiers: Sequence[str]) -> list[str]:
    """The distributions a set installs from their sdists: the names of its `--no-binary=NAME` entries
    (normalized; a comma-separated list is several)."""
    names: list[str] = []
    for spec in specifiers:
        m = _NO_BINARY.match(spec.strip())
        if m:
            names += [canonicalize_name(n) for n in m.group(1).split(",") if n]
    return names


def requirement_lines(specifiers: Sequence[str]) -> list[str]:
    """A set's requirement specifiers without its options (`--no-binary=NAME`)."""
    return [s for s in specifiers if not s.strip().startswith("-")]


# The newest manylinux_2_XX that uv's --python-platform names (uv 0.13: 2_40). A newer glibc (Debian 13's 2.41) runs
# every wheel of an older tag, so the platform is capped here; only a wheel tagged for 2.41 alone would be missed.
UV_NEWEST_GLIBC = "2.40"


def target(resolved: Resolved, arch: str | None = None) -> tuple[str, str]:
    """(Python version, platform) the image's wheels are resolved for on `arch` (default: the recipe's first): the
    `python` pin's version (3.11 on Debian 12) and `<machine>-manylinux_2_XX` with the target distribution's glibc
    (x86_64-manylinux_2_36, aarch64-manylinux_2_36), capped at what uv names (UV_NEWEST_GLIBC)."""
    r = resolved.recipe
    os_id = f"{r.os.family}{r.os.version}"
    distro = DISTRO.get(os_id)
    if distro is None:
        raise ResolveError(f"{r.name}: no glibc known for {os_id} (core.distro.DISTRO has {', '.join(DISTRO)})")
    py = resolved.pins.get("python")
    if py is None or not py.version:
        raise ResolveError(f"{r.name}: its requirement sets need the python pin's version (components.python)")
    machine = platforms.MACHINE[arch or r.platform.arch[0]]
    glibc = min(Version(distro.glibc), Version(UV_NEWEST_GLIBC))
    return ".".join(py.version.split(".")[:2]), f"{machine}-manylinux_{glibc.major}_{glibc.minor}"


def uv_deadline() -> tuple[float, dict[str, str], str]:
    """(seconds, uv's settings, where the seconds come from) for one uv resolution. With IMGBUILD_INDEX_DEADLINE set,
    the resolution ends by it, uv's retries included: uv is killed at the deadline. Each of uv's requests may take
    no longer than the lookup deadline (UV_HTTP_TIMEOUT: uv's own 30 s, or the user's, lowered to it). Unset, a
    resolution (a set's closure is many lookups: torch's reads some twenty wheels' metadata) may take UV_TIMEOUT_S."""
    from imgbuild.pin import pypi  # requests: not for the quick commands that import this module

    seconds = pypi.deadline_seconds(None)  # IMGBUILD_INDEX_DEADLINE, else the default; a malformed one is refused
    settings = {"UV_HTTP_TIMEOUT": str(request_timeout(seconds))}
    if os.environ.get(pypi.DEADLINE_ENV, "").strip():
        return seconds, settings, f"{pypi.DEADLINE_ENV}={seconds:g}"
    return float(UV_TIMEOUT_S), settings, f"{UV_TIMEOUT_S} s for one resolution; {pypi.DEADLINE_ENV} sets another"


# uv's own ways of naming an index (variables; uv.toml is left out by --no-config): imgbuild names the one it reads.
_UV_INDEX_VARIABLES = ("UV_INDEX", "UV_DEFAULT_INDEX", "UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS")


def uv_index(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` for a uv run that reads imgbuild's one index (`pypi.index_url`) and no other: uv's index variables
    are dropped and UV_DEFAULT_INDEX names it (in the environment, not on the command line, where a URL's
    credentials would show in the process list); the caller passes --no-config so that no uv.toml adds another."""
    from imgbuild.pin import pypi

    env = {k: v for k, v in environ.items() if k not in _UV_INDEX_VARIABLES}
    env["UV_DEFAULT_INDEX"] = pypi.index_url()
    return env


def request_timeout(deadline: float | None = None) -> int:
    """Seconds one request to the index may take (uv's UV_HTTP_TIMEOUT, pip's --timeout): the user's
    UV_HTTP_TIMEOUT or uv's own 30 s, lowered to the lookup deadline (`deadline`, else IMGBUILD_INDEX_DEADLINE's or
    the default)."""
    from imgbuild.pin import pypi

    seconds = pypi.deadline_seconds(deadline)
    theirs = os.environ.get("UV_HTTP_TIMEOUT", "").strip()
    per_request = int(theirs) if theirs.isdigit() and int(theirs) > 0 else UV_HTTP_TIMEOUT_S
    return max(1, min(per_request, math.floor(seconds)))


def uv_bin() -> str:
    """The uv binary of the `uv` distribution (a dependency of imgbuild); an `IndexLookupError` when it is not
    installed."""
    try:
        import uv

        return str(uv.find_uv_bin())
    except (ImportError, FileNotFoundError) as exc:
        raise IndexLookupError(
            f"uv is needed to pin the image's Python distributions by hash and cannot be found: {exc}",
            hint="pip install uv (a dependency of imgbuild)",
        ) from None


def install_order(names: Sequence[str]) -> list[str]:
    """Requirement set names in the order a build installs them: the sets of blocks that install in the builder
    stage (their venv the runtime stage copies), then the runtime stage's (`Block.requirements_stage`), each in the
    order given. The registry lists blocks in runtime layer order (PyTorch before mpi4py), not install order."""
    from imgbuild.blocks import BY_NAME, PythonSets

    def stage(name: str) -> int:
        block = BY_NAME.get(name.split("/")[0])
        return 1 if isinstance(block, PythonSets) and block.requirements_stage == "runtime" else 0

    return sorted(names, key=stage)


def apart(name: str) -> bool:
    """Whether requirement set `name` installs apart from the venv (`Block.requirements_apart`): resolved before the
    others, whole, its versions constraining theirs."""
    from imgbuild.blocks import BY_NAME, PythonSets

    block = BY_NAME.get(name.split("/")[0])
    return isinstance(block, PythonSets) and name in block.requirements_apart


def resolution_order(names: Sequence[str]) -> list[str]:
    """Requirement set names in the order they resolve: the sets installed apart from the venv (`apart`) first, then
    the others, each group in install order (`install_order`)."""
    ordered = install_order(list(names))
    return [n for n in ordered if apart(n)] + [n for n in ordered if not apart(n)]


def set_inputs(sets: Mapping[str, Sequence[str]], resolved: Resolved) -> dict[str, tuple[object, ...]]:
    """For each requirement set, all that its closure follows from besides the index: the targets (Python and
    platform of each architecture), the distributions blocks bring outside pip (`provided`), and its specifiers with
    those of every set resolved before it (`resolution_order`: their pins constrain it). Two resolutions that give a
    set equal inputs resolve it to the same closure from the same index."""
    targets = tuple(target(resolved, arch) for arch in resolved.recipe.platform.arch)
    given = tuple(sorted((name, version) for name, (version, _) in provided(resolved).items()))
    out: dict[str, tuple[object, ...]] = {}
    before: list[tuple[str, tuple[str, ...]]] = []
    for name in resolution_order(list(sets)):
        before.append((name, tuple(sets[name])))
        out[name] = (targets, given, tuple(before))
    return out


class Recorded(NamedTuple):
    """A lock's requirement sets as it recorded them (`python`), with the inputs they were resolved from
    (`set_inputs`) and the lock file's name (`where`): closures an offline lock may take instead of asking uv."""

    where: str
    inputs: Mapping[str, tuple[object, ...]]
    python: Mapping[str, tuple[Requirement, ...]]


def recorded_in(where: str, locked: Resolved, sets: Mapping[str, Sequence[str]]) -> Recorded | None:
    """A lock's closures with their inputs (`Recorded`); None when it records no requirement set, or when its inputs
    cannot be told (no target known for it): it vouches for nothing then."""
    if locked.content is None or not locked.content.python or not sets:
        return None
    try:
        inputs = set_inputs(sets, locked)
    except ResolveError:
        return None
    return Recorded(where, inputs, dict(locked.content.python))


def reusable(
    sets: Mapping[str, Sequence[str]],
    resolved: Resolved,
    recorded: Sequence[Recorded],
    preferences: Mapping[str, str],
) -> tuple[dict[str, tuple[Requirement, ...]], str | None]:
    """The closures an offline lock takes from a lock at hand (the first of `recorded` that has any) and that lock's
    name: each set, in resolution order, whose inputs equal the ones the lock resolved it from, up to the first that
    differs (a later set's pins follow from the earlier ones'). A set whose recorded versions contradict
    `preferences` (the recipe's own lock's) is not taken, nor any after it."""
    if not recorded or not sets:
        return {}, None
    mine = set_inputs(sets, resolved)  # in resolution order
    for rec in recorded:
        taken: dict[str, tuple[Requirement, ...]] = {}
        for name in mine:
            closure = rec.python.get(name)
            if closure is None or rec.inputs.get(name) != mine[name]:
                break
            if any(preferences.get(r.name, r.version) != r.version for r in closure):
                break
            taken[name] = tuple(closure)
        if taken:
            return taken, rec.where
    return {}, None


def compile_sets(
    sets: Mapping[str, Sequence[str]],
    resolved: Resolved,
    *,
    offline: bool = False,
    preferences: Mapping[str, str] | None = None,
    yanked: list[Yank] | None = None,
    recorded: Sequence[Recorded] = (),
    taken: list[str] | None = None,
) -> dict[str, tuple[Requirement, ...]]:
    """Each requirement set's closure with hashes, in install order (`install_order`): a set holds only what the
    sets before it do not (they constrain its versions). Resolved for each of the recipe's architectures; the
    versions must agree, and each requirement holds every architecture's hashes. `offline`: no network: a set whose
    inputs equal those a lock at hand (`recorded`: the recipe's own, its parents') resolved it from takes that lock's
    closure (`reusable`; `taken`, when given, receives a line naming the sets and the lock), and uv answers the rest
    from its cache (uv's --offline; what it has not cached fails the set, naming it). `preferences`: normalized name ->
    version, the existing lock's pins, kept where they still resolve (`preference_file`). `yanked`, when given,
    receives each distribution resolved to a yanked release. Raises `ResolveError` when a set
    cannot be resolved (uv's message, the recipe and the set named) or resolves differently on two architectures,
    and `IndexLookupError` when uv cannot run or reach the index."""
    prefer = dict(preferences or {})
    found: set[Yank] = set()
    reuse, where = reusable(sets, resolved, recorded, prefer) if offline else ({}, None)
    if reuse and taken is not None:
        taken.append(f"python {', '.join(reuse)}: from {where} (--offline: the same requirements for the same targets)")
    per_arch = {
        arch: _compile_arch(sets, resolved, arch, offline, prefer, found, reuse)
        for arch in resolved.recipe.platform.arch
    }
    if yanked is not None:
        yanked.extend(sorted(found))
    first, *others = per_arch
    out: dict[str, tuple[Requirement, ...]] = {}
    for name, reqs in per_arch[first].items():
        merged = {r.name: r for r in reqs}
        for arch in others:
            theirs = {r.name: r for r in per_arch[arch][name]}
            if {n: r.version for n, r in theirs.items()} != {n: r.version for n, r in merged.items()}:
                mine = ", ".join(f"{n}=={r.version}" for n, r in sorted(merged.items()))
                other = ", ".join(f"{n}=={r.version}" for n, r in sorted(theirs.items()))
                raise ResolveError(
                    f"{resolved.name}: requirement set {name} resolves differently for {first} ({mine}) and "
                    f"{arch} ({other}); pin the versions in the recipe so both architectures install the same"
                )
            merged = {
                n: r.model_copy(update={"hashes": tuple(sorted({*r.hashes, *theirs[n].hashes}))})
                for n, r in merged.items()
            }
        out[name] = tuple(merged[r.name] for r in reqs)
    return out


def _compile_arch(
    sets: Mapping[str, Sequence[str]],
    resolved: Resolved,
    arch: str,
    offline: bool,
    preferences: Mapping[str, str],
    yanked: set[Yank],
    reuse: Mapping[str, tuple[Requirement, ...]],
) -> dict[str, tuple[Requirement, ...]]:
    python, platform = target(resolved, arch)
    out: dict[str, tuple[Requirement, ...]] = {}
    # name -> (version, what pins it): the distributions blocks bring outside pip, then every earlier set's
    pinned: dict[str, tuple[str, str]] = dict(provided(resolved))
    # The sets installed apart from the venv (the CUDA toolkit's wheels) come first: their whole closure is theirs, and
    # its versions constrain the venv's sets too (one image, one version of each: torch's cuda-toolkit pin and the
    # toolkit's are the same release, and a venv package that takes any nvidia-cuda-cccl gets the toolkit's), without
    # taking those distributions out of the venv.
    constraints = dict(pinned)
    with tempfile.TemporaryDirectory(prefix="imgbuild-wheels-") as tmp:
        folder = Path(tmp)
        for name in resolution_order(list(sets)):
            found: dict[str, tuple[str, str]] = {}
            if name in reuse:  # a lock at hand resolved this set from the same inputs: its closure, as recorded
                closure = list(reuse[name])
            else:
                closure = _resolve_set(folder, resolved.name, name, sets[name], constraints, python, platform,
                                       offline, preferences, found)  # fmt: skip
            if apart(name):  # installed apart from the venv: its whole closure, constraining the venv's versions
                mine = tuple(closure)
                for r in mine:
                    constraints.setdefault(r.name, (r.version, f"requirement set {name}"))
            else:
                mine = tuple(r for r in closure if r.name not in pinned)
                for r in mine:
                    pinned[r.name] = constraints[r.name] = (r.version, f"requirement set {name}")
            yanked.update(Yank(name, r.name, r.version, found[r.name][1]) for r in mine if r.name in found)
            out[name] = mine
    return out


def _resolve_set(
    folder: Path,
    recipe: str,
    name: str,
    specifiers: Sequence[str],
    constraints: Mapping[str, tuple[str, str]],
    python: str,
    platform: str,
    offline: bool,
    preferences: Mapping[str, str],
    yanked: dict[str, tuple[str, str]],
) -> list[Requirement]:
    """Set `name`'s closure from uv, with `constraints`' versions pinned (`_compile`); when it has no solution, the
    error says which pinned distributions it would replace (`_replaced`)."""
    uv = uv_bin()
    versions = {n: v for n, (v, _) in constraints.items()}
    try:
        return _compile(
            uv, folder, recipe, name, specifiers, versions, python, platform, offline,
            preferences=preferences, yanked=yanked,
        )  # fmt: skip
    except ResolveError as exc:
        raise _replaced(exc, uv, folder, recipe, name, specifiers, constraints, python, platform, offline) from exc


def provided(resolved: Resolved) -> dict[str, tuple[str, str]]:
    """The Python distributions the image's blocks bring outside pip (`Block.python_dists`: Debian's python3-mpi4py,
    a base image's torch): name -> (version, which component)."""
    from imgbuild.blocks import REGISTRY, PythonDists

    return {
        canonicalize_name(dist): (version, f"components.{b.name} ({resolved.pins[b.name].source})")
        for b in REGISTRY
        if b.name in resolved.pins and isinstance(b, PythonDists)
        for dist, version in b.python_dists(resolved.pins[b.name]).items()
    }


def _replaced(
    exc: ResolveError,
    uv: str,
    folder: Path,
    recipe: str,
    name: str,
    specifiers: Sequence[str],
    pinned: Mapping[str, tuple[str, str]],
    python: str,
    platform: str,
    offline: bool,
) -> ResolveError:
    """Why set `name` has no solution with the earlier pins as constraints, in the words a user needs: resolved on its
    own, which pinned distributions it would replace, and with what ("requirements would replace torch 2.9.1 with
    2.8.0"). uv's own message when the set has no solution even alone, or when nothing pinned moves."""
    if not pinned:
        return exc
    alone = folder / "alone"
    alone.mkdir(exist_ok=True)
    try:
        closure = _compile(uv, alone, recipe, name, specifiers, {}, python, platform, offline)
    except (ResolveError, IndexLookupError):
        return exc
    finally:
        shutil.rmtree(alone, ignore_errors=True)
    named = [
        canonicalize_name(re.split(r"[\s\[<>=!~;@]", line.strip(), maxsplit=1)[0])
        for line in requirement_lines(specifiers)
    ]
    moved = [
        f"{r.name} {pinned[r.name][0]} ({pinned[r.name][1]}) with {r.version}"
        for r in sorted(closure, key=lambda r: (r.name not in named, r.name))  # what the set names first
        if r.name in pinned and not same_version(r.version, pinned[r.name][0])
    ]
    if not moved:
        return exc
    return ResolveError(
        f"{recipe}: requirement set {name} ({', '.join(requirement_lines(specifiers))}): requirements would replace "
        + "; ".join(moved)
        + ": the image's stack pins these, and one image holds one version of each",
        hint="take the stack's version (leave the requirement unpinned, or pin what the lock has), "
        "or extend a recipe whose stack pins the version you need",
    )


def _compile(
    uv: str,
    folder: Path,
    recipe: str,
    name: str,
    specifiers: Sequence[str],
    pinned: Mapping[str, str],
    python: str,
    platform: str,
    offline: bool = False,
    *,
    preferences: Mapping[str, str] | None = None,
    yanked: dict[str, tuple[str, str]] | None = None,
) -> list[Requirement]:
    """One set's closure, resolved by uv with `pinned` as constraints and `preferences` as the previous output's pins;
    `yanked` (when given) receives name -> (version, reason) for each yanked release uv resolved to."""
    where = f"{recipe}: requirement set {name}"
    lines = requirement_lines(specifiers)
    if not lines:
        raise ResolveError(f"{where}: no requirement in {list(specifiers)}")
    sources = no_binary(specifiers)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", name)
    (folder / f"{slug}.in").write_text("".join(f"{line}\n" for line in lines))
    (folder / f"{slug}.constraints.txt").write_text("".join(f"{n}=={v}\n" for n, v in sorted(pinned.items())))
    lock = folder / slug / "pylock.toml"  # uv wants the name pylock.toml for this format
    lock.parent.mkdir()
    if preferences:
        lock.write_text(preference_file(preferences))
    # --python: the interpreter that runs imgbuild builds a source distribution's metadata where one is needed (the
    # target is --python-version and --python-platform). Left to find one, uv queries every python on PATH that might
    # be the target's version (about 1 s with pyenv's shims, at every set of every lock).
    argv = [  # not --quiet: uv's warnings name the yanked releases it resolved to
        uv, "pip", "compile", "--no-config", "--no-python-downloads", "--generate-hashes", "--python", sys.executable,
        "--python-version", python, "--python-platform", platform,
        "--constraints", str(folder / f"{slug}.constraints.txt"),
        *(f"--no-binary={n}" for n in sources),  # `=`: a name is never read as an option of uv
        *(["--offline"] if offline else []),
        "--format", "pylock.toml", "--output-file", str(lock), str(folder / f"{slug}.in"),
    ]  # fmt: skip
    limit, settings, named = uv_deadline()
    env = {**uv_index(os.environ), "UV_NO_PROGRESS": "1", "NO_COLOR": "1", **settings}
    try:
        ran = subprocess.run(argv, capture_output=True, text=True, timeout=limit, env=env, check=False)
    except subprocess.TimeoutExpired:  # uv is killed: its retries end with it
        raise IndexLookupError(
            f"{where}: uv pip compile did not finish within {limit:g} s ({named}): the package index did not answer "
            "in time",
            hint="check that the index (IMGBUILD_INDEX_URL, else pip's configuration) answers; "
            "IMGBUILD_INDEX_DEADLINE gives a slow one more time",
        ) from None
    except OSError as exc:
        raise IndexLookupError(f"{where}: cannot run {uv}: {exc.strerror or exc}") from None
    if ran.returncode != 0:
        message = (ran.stderr.strip() or ran.stdout.strip() or f"exit {ran.returncode}").replace("\n", "\n  ")
        why = f"{where} ({', '.join(lines)}) for Python {python} on {platform}: uv pip compile failed:\n  {message}"
        if "No solution found" in ran.stderr:
            raise ResolveError(why)
        raise IndexLookupError(why, hint="the index is IMGBUILD_INDEX_URL's, else pip's configuration (PIP_INDEX_URL)")
    if yanked is not None:
        for m in _YANKED.finditer(ran.stderr):
            yanked[canonicalize_name(m.group(1))] = (m.group(2), (m.group(3) or "").strip().strip('"'))
    return _read(lock, where, set(sources))


def preference_file(preferences: Mapping[str, str]) -> str:
    """The previous output uv reads its preferences from (`uv pip compile --output-file`, here a pylock.toml): one
    package entry (name, version) for each preferred pin. Only a valid distribution name and PEP 440 version is written
    (what a lock holds came from a file a user may have edited: anything else is left out, never written into TOML)."""
    lines = ['lock-version = "1.0"', 'created-by = "imgbuild (the existing lock\'s pins, preferred)"']
    for name, version in sorted(preferences.items()):
        try:
            Version(version)
        except InvalidVersion:
            continue
        if re.fullmatch(r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?", name) and re.fullmatch(r"[A-Za-z0-9.+!_-]+", version):
            lines += ["", "[[packages]]", f'name = "{name}"', f'version = "{version}"']
    return "\n".join(lines) + "\n"


def _read(lock: Path, where: str, sources: set[str]) -> list[Requirement]:
    """The requirements of uv's pylock.toml: each package's wheels' hashes, or its sdist's for one installed from
    source (a `--no-binary` name, or a package with no wheel for the target: pip would build it)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib

    try:
        data = tomllib.loads(lock.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise IndexLookupError(f"{where}: cannot read uv's {lock.name}: {exc}") from None
    out: list[Requirement] = []
    for package in data.get("packages", []):
        pkg = canonicalize_name(str(package["name"]))
        version = str(package.get("version") or "")
        sdist = package.get("sdist")
        files: list[Any] = [sdist] if pkg in sources or not package.get("wheels") else package["wheels"]
        hashes = [f"sha256:{f['hashes']['sha256']}" for f in files if f and "sha256" in f.get("hashes", {})]
        if not version or not hashes:
            what = "an sdist" if pkg in sources else "a wheel or sdist"
            raise IndexLookupError(
                f"{where}: the index gives {pkg} {version or '(no version)'} no {what} with a sha256 for the target"
            )
        out.append(Requirement(name=pkg, version=version, hashes=tuple(sorted(hashes))))
    return out
