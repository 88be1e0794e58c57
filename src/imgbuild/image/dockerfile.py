"""The Dockerfile's vocabulary: what the templates (images/Dockerfile.j2, each block's fragments) write a step with.

Each mount is written once here and reaches the templates as a Jinja global (`template_globals`: `run`, `ca_mount`,
`pip_cache_mount`, `pip_install`, `apt_mounts`, `cache_mount`, ...) or filter (`template_filters`: `shquote`,
`kvlines`); imgbuild.image.render's environment hands them over. The Dockerfile is for BuildKit (the classic builder
cannot build it): downloads trust the CA bundle through a build secret, apt and pip keep their downloads in cache
mounts, an offline build reads everything from the sources folder. It needs no `# syntax` line (the Dockerfile
frontend built into Docker 20.10's BuildKit reads it) and no `COPY --chmod`: file modes travel in the build context.
Pure text: no Docker, no network.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from imgbuild.blocks import BY_NAME, REGISTRY, Context, PythonSets, builder_base, slug
from imgbuild.blocks.python import UV_BIN, UV_CACHE_DIR, UV_CACHE_ID, UV_DIR, UV_SET, uv_installs
from imgbuild.core import paths
from imgbuild.core.errors import RenderError
from imgbuild.pin.content import download_name

# The CA bundle downloads during a build trust travels as a BuildKit build secret (never a file of the context,
# never in a layer): `RUN --mount=type=secret,id=CA_SECRET_ID,target=CA_SECRET_PATH` on every step that downloads.
# The build always passes it (context.ca_secret: certifi's roots, plus --ca-bundle), so the mount is required: a
# build without it fails at the first download instead of trusting something else.
CA_SECRET_ID = "imgbuild-ca"
CA_SECRET_PATH = "/run/secrets/imgbuild-ca.pem"
CA_MOUNT = f"--mount=type=secret,id={CA_SECRET_ID},target={CA_SECRET_PATH},required=true"
# What points downloading tools at the secret: the builder stage's ENV (that stage is never shipped); in the runtime
# stage only PIP_CERT, as a prefix of the pip command (the final image's ENV never names the secret).
CA_ENV = {name: CA_SECRET_PATH for name in ("CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "PIP_CERT", "REQUESTS_CA_BUNDLE",
                                           "SSL_CERT_FILE")}  # fmt: skip
PIP_QUIET = {"PIP_DISABLE_PIP_VERSION_CHECK": "1"}  # both stages' pip: no check for a newer pip
PIP_ENV = " ".join(f"{k}={v}" for k, v in {"PIP_CERT": CA_SECRET_PATH, **PIP_QUIET}.items())
# One pip cache for every pip step of every recipe (the nccl wheel, PyTorch's CUDA wheels and torch, mpi4py's
# sdist): `locked`, since two builds writing one pip cache at once would race. What pip builds from an sdist is kept
# apart (see the mpi4py block).
PIP_CACHE_DIR = "/root/.cache/pip"
PIP_CACHE_ID = "imgbuild-pip"
# apt's lists and downloaded packages, one pair per base image (a stage's own base: Debian and Ubuntu releases
# never share lists), `locked` because apt takes its own lock on both.
APT_CACHE_DIRS = {"cache": "/var/cache/apt", "lists": "/var/lib/apt/lists"}


def cache_mount(cache_id: str, target: str) -> str:
    """A BuildKit cache mount shared by concurrent builds one at a time (`sharing=locked`)."""
    return f"--mount=type=cache,id={cache_id},target={target},sharing=locked"


PIP_CACHE_MOUNT = cache_mount(PIP_CACHE_ID, PIP_CACHE_DIR)
# pip's HTTP cache keeps a download only when the index's answer allows it (Cache-Control, ETag or Last-Modified):
# behind an index or proxy that sends none of them (the one this project's machines reach does not), every rebuild
# would download every wheel again. So where pip installs a set (uv itself, a set with --no-binary, a recipe with no
# venv or no lock), its prebuilt wheels are fetched by `pip download` into a folder of the pip cache mount, which
# skips a file already there ("File was already downloaded", checked against the index's sha256), and installed from
# that folder alone (--no-index). mpi4py, built from its sdist, keeps pip's own caches (see its block).
WHEELHOUSE = f"{PIP_CACHE_DIR}/imgbuild-wheelhouse"
# Every other hashed set installs with uv (the python block's `python/uv` set, pinned and hashed by the lock like the
# others, installed by pip in the builder stage apart from the venv; the runtime stage's RUNs bind-mount it from
# there, so it is in no layer): `uv pip install --require-hashes --no-deps -r` the same file, downloading and
# installing in parallel. Its cache (downloads and unpacked wheels, keyed by hash: a rebuild downloads nothing again)
# is a cache mount of its own, another filesystem than the image's, so files are copied out of it (--link-mode=copy),
# and it compiles the bytecode as pip does (--compile-bytecode, in parallel). It trusts the CA secret through
# SSL_CERT_FILE, as pip does through PIP_CERT.
UV_CACHE_MOUNT = cache_mount(UV_CACHE_ID, UV_CACHE_DIR)
UV_ENV = f"SSL_CERT_FILE={CA_SECRET_PATH}"
UV_OPTIONS = "--link-mode=copy --compile-bytecode"
# Every pip or uv step installs one requirement set (`Block.requirements`) as the lock recorded it: the set's
# requirements file (name==version and the sha256 of every file the target may install) is a context file,
# bind-mounted into its RUN (in no layer), and pip or uv installs it with --require-hashes --no-deps: a file with
# another hash fails the build with a message naming the file, the expected and the actual hash. Sets install in the
# lock's order, each one's dependencies being in the sets before it, so --no-deps leaves nothing out.
REQUIREMENTS_CONTEXT = "imgbuild/requirements"
REQUIREMENTS_DIR = "/tmp/imgbuild-requirements"


def requirements_path(name: str) -> str:
    """The context path of requirement set `name`'s file (`pytorch/cuda` -> imgbuild/requirements/pytorch.cuda.txt);
    its RUN mounts it at the same name under REQUIREMENTS_DIR."""
    return f"{REQUIREMENTS_CONTEXT}/{name.replace('/', '.')}.txt"


def requirement_set(ctx: Context, name: str) -> list[str]:
    """Requirement set `name`'s specifiers, from the block named by its first part (`Block.requirements`)."""
    block = name.split("/")[0]
    sets = next(
        (b.requirements(ctx.need(b.name), ctx) for b in REGISTRY if b.name == block if isinstance(b, PythonSets)), {}
    )
    if name not in sets:
        raise RenderError(f"{ctx.resolved.name}: no requirement set {name!r} in block {block!r} (it has {list(sets)})")
    return list(sets[name])


def set_file(ctx: Context, name: str) -> tuple[str, str]:
    """(the RUN's bind mount of set `name`'s requirements file, where it is mounted): the lock must record the set."""
    if name not in ctx.content.python:
        raise RenderError(
            f"{ctx.resolved.name}: the lock records no requirement set {name!r}: refresh it (imgbuild lock)"
        )
    file = f"{REQUIREMENTS_DIR}/{requirements_path(name).rsplit('/', 1)[1]}"
    return f"--mount=type=bind,source={requirements_path(name)},target={file}", file


# Files of Python distributions that are documentation and hold credential-shaped examples (boto3's CloudFront
# example has AWS's documented example access key; botocore's IAM examples a PEM private-key header): secret scanners
# flag them (verify's no-keys-in-image among them) and nothing imports them. The RUN that installs such a distribution
# removes them, so no layer holds them. Distribution -> globs under the environment's site-packages.
PRUNED_DOCS: dict[str, tuple[str, ...]] = {
    "boto3": ("boto3/examples",),
    "botocore": ("botocore/data/*/*/examples-1.json",),
}


def prune_docs(ctx: Context, name: str, specifiers: Sequence[str], pip: str, target: str | None) -> str:
    """What the RUN installing requirement set `name` (its `specifiers`) runs after its install (`" \\\n && ..."`, or
    nothing): the PRUNED_DOCS globs of the distributions it installs (its lock closure; without lock content, whose
    closure is not known, all of them when the specifiers name any), under the site-packages of `pip`'s Python, or
    under `target`."""
    from packaging.utils import canonicalize_name

    names: set[str]
    if ctx.content is None:  # (a rendering without lock content only: packaging.requirements costs an import)
        from packaging.requirements import Requirement

        from imgbuild.pin.wheels import requirement_lines

        named = {canonicalize_name(Requirement(line).name) for line in requirement_lines(specifiers)}
        names = set(PRUNED_DOCS) if named & set(PRUNED_DOCS) else set()
    else:
        names = {str(canonicalize_name(r.name)) for r in ctx.content.python.get(name, ())} & set(PRUNED_DOCS)
    globs = [glob for dist in sorted(names) for glob in PRUNED_DOCS[dist]]
    if not globs:
        return ""
    purelib = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site = shlex.quote(target) if target else f'"$({python_of(pip)} -c "{purelib}")"'
    paths = " ".join('"$site"/' + glob for glob in globs)
    return f" \\\n && site={site} && rm -rf -- {paths}"


def pip_install(
    context: Any,
    pip: str,
    ctx: Context,
    name: str,
    env: str = "",
    *,
    build_env: str = "",
    mounts: Sequence[str] = (),
    target: str | None = None,
) -> str:
    """The RUN that installs requirement set `name` (of the block named by its first part) into the environment of
    `pip`: from the lock's hashes when the resolution has content (`--require-hashes --no-deps -r` the set's file),
    with uv where the image has it (`uv_install`), else with pip (downloaded into the wheelhouse, then installed from
    it alone); with the Jinja global `sources_dir` set, from its wheels/ folder with no download. Without content,
    from the block's specifiers, unhashed, with pip, as the Dockerfile's comment says. A set with `--no-binary=NAME`
    builds NAME from its sdist with --no-build-isolation, with pip: its build requirements are a set of their own,
    installed (hashed) before it. `env` prefixes pip's download (the runtime stage's PIP_ENV), `build_env` the install
    (a source build's CFLAGS), `mounts` are the RUN's own besides the CA secret, the cache and the requirements file;
    `target` installs into that folder (--target), apart from the venv (a set of `Block.requirements_apart`).
    `context` is Jinja's (the environment's `run` and `sources_dir`)."""
    from imgbuild.pin.wheels import no_binary, requirement_lines

    specifiers = requirement_set(ctx, name)
    sources = no_binary(specifiers)
    options = f" --no-binary={','.join(sources)} --no-build-isolation" if sources else ""
    into = f" --target {target}" if target is not None else ""  # install's alone: pip download has no --target
    run_, sources_dir = context["run"], context.get("sources_dir")
    download_env, install_env = (f"{e} " if e else "" for e in (env, build_env))
    step: str
    if ctx.content is None:  # each requirement a shell word, one to a line when there are more than two
        words = [shlex.quote(r) for r in requirement_lines(specifiers)]
        head = f"# No lock content: requirement set {name} installs unhashed (`imgbuild lock` records its hashes).\n"
        download = f"{download_env}{pip} download --dest {WHEELHOUSE}{options}"
        install = f"{install_env}{pip} install --no-index --find-links {WHEELHOUSE}{options}{into}"
        if len(words) <= 2:
            reqs = " ".join(words)
            step = f"{head}{run_(CA_MOUNT, PIP_CACHE_MOUNT, *mounts)}{download} {reqs} \\\n && {install} {reqs}"
        else:
            listed = " \\\n".join(f"      {w}" for w in words)
            command = f'set -- \\\n{listed} \\\n && {download} "$@" \\\n && {install} "$@"'
            step = f"{head}{run_(CA_MOUNT, PIP_CACHE_MOUNT, *mounts)}{command}"
    else:
        bind, file = set_file(ctx, name)
        hashed = f"--require-hashes --no-deps{options} -r {file}"
        if not sources and name != UV_SET and uv_installs(ctx):
            step = uv_install(context, pip, ctx, name, bind, file, build_env=build_env, mounts=mounts, target=target)
        elif sources_dir:
            install = f"{install_env}{pip} install --no-index --find-links {sources_dir}/wheels{into} {hashed}"
            step = f"{run_(CA_MOUNT, PIP_CACHE_MOUNT, bind, *mounts)}{install}"
        else:
            step = (
                f"{run_(CA_MOUNT, PIP_CACHE_MOUNT, bind, *mounts)}"
                f"{download_env}{pip} download --dest {WHEELHOUSE} {hashed} \\\n"
                f" && {install_env}{pip} install --no-index --find-links {WHEELHOUSE}{into} {hashed}"
            )
    return step + prune_docs(ctx, name, specifiers, pip, target)  # in the same RUN: no layer holds them


def python_of(pip: str) -> str:
    """The interpreter of the environment `pip` installs into (`/opt/venv/bin/pip` -> /opt/venv/bin/python,
    `python3 -m pip` -> python3): uv's --python."""
    if pip.endswith(" -m pip"):
        return pip[: -len(" -m pip")]
    folder, _, tool = pip.rpartition("/")
    if tool == "pip" and folder:
        return f"{folder}/python"
    raise RenderError(f"cannot tell the Python of {pip!r} (expected DIR/pip or PYTHON -m pip)")


def uv_install(
    context: Any,
    pip: str,
    ctx: Context,
    name: str,
    bind: str,
    file: str,
    *,
    build_env: str = "",
    mounts: Sequence[str] = (),
    target: str | None = None,
) -> str:
    """The RUN that installs hashed requirement set `name` (its file `file`, mounted by `bind`) with uv
    (`uv pip install --require-hashes --no-deps -r FILE`) into the environment of `pip` (its interpreter is uv's
    --python), or into `target` (--target): parallel downloads into uv's cache mount, bytecode compiled
    (UV_OPTIONS); offline (`sources_dir`), from its wheels/ folder alone (--no-index --offline). A set the runtime
    stage installs (`Block.requirements_stage`) mounts uv from the builder stage (UV_DIR), so uv is in no layer."""
    run_, sources_dir = context["run"], context.get("sources_dir")
    block = BY_NAME.get(name.split("/")[0])
    runtime = isinstance(block, PythonSets) and block.requirements_stage == "runtime"
    own = [uv_builder_mount()] if runtime else []
    into = f" --target {target}" if target is not None else ""
    index = f" --no-index --offline --find-links {sources_dir}/wheels" if sources_dir else ""
    prefix = " ".join(p for p in (UV_ENV, build_env) if p)
    return (
        f"{run_(CA_MOUNT, UV_CACHE_MOUNT, bind, *own, *mounts)}"
        f"{prefix} {UV_BIN} pip install --python {python_of(pip)} {UV_OPTIONS}{into}{index} "
        f"--require-hashes --no-deps -r {file}"
    )


def uv_builder_mount() -> str:
    """A runtime-stage RUN's mount of uv (UV_DIR) from the builder stage, read-only and in no layer."""
    return f"--mount=type=bind,from=builder,source={UV_DIR},target={UV_DIR}"


def pip_wheel(
    context: Any, pip: str, ctx: Context, name: str, wheel_dir: str, env: str = "", build_env: str = ""
) -> str:
    """The RUN that builds requirement set `name` into wheels in `wheel_dir` with `pip wheel --no-deps
    --no-build-isolation`: its `--no-binary` names from their sdists (checked against the lock's hashes), compiled
    against what the stage has installed (the image's torch, NCCL and MPI), its other requirements as the index has
    them (hashed too). `env` prefixes the command (PIP_ENV), `build_env` the builds' variables."""
    from imgbuild.pin.wheels import no_binary, requirement_lines

    specifiers = requirement_set(ctx, name)
    sources = no_binary(specifiers)
    options = f"--no-binary={','.join(sources)} " if sources else ""
    prefix = " ".join(p for p in (env, build_env) if p)
    prefix = f"{prefix} " if prefix else ""
    index = f"--no-index --find-links {context['sources_dir']}/wheels " if context.get("sources_dir") else ""
    head = f"{prefix}{pip} wheel --no-deps --no-build-isolation {index}{options}--wheel-dir {wheel_dir}"
    if ctx.content is None:
        words = " ".join(shlex.quote(r) for r in requirement_lines(specifiers))
        note = f"# No lock content: requirement set {name} builds unhashed (`imgbuild lock` records its hashes).\n"
        return f"{note}{context['run'](CA_MOUNT, PIP_CACHE_MOUNT)}{head} {words}"
    bind, file = set_file(ctx, name)
    return f"{context['run'](CA_MOUNT, PIP_CACHE_MOUNT, bind)}{head} --require-hashes -r {file}"


def apt_mounts(base_ref: str) -> list[str]:
    """The cache mounts of a stage's apt-get steps: `imgbuild-apt-<base slug>-cache` and `-lists`."""
    return [cache_mount(f"imgbuild-apt-{slug(base_ref)}-{name}", target) for name, target in APT_CACHE_DIRS.items()]


def run(*mounts: str) -> str:
    """`RUN` with its mounts, one to a line, and the indent of the command that follows on the next line."""
    return "RUN " + "".join(f"{m} \\\n    " for m in mounts)


# An offline build (`imgbuild build --sources DIR`, with the build's network off) takes everything from the folder
# `imgbuild sources fetch` filled, put in the build context as SOURCES_CONTEXT and bind-mounted (read-only, in no
# layer) at SOURCES_DIR by every RUN that would download: files/ (the tarballs), wheels/, and debs/<base slug>/ (a flat
# apt repository of the .debs each base's stages install, with its Packages index). Everything there was checked
# against the lock and the fetch's own record before the build started (imgbuild.build.sources).
SOURCES_DIR = "/imgbuild-sources"
SOURCES_CONTEXT = "imgbuild-sources"
SOURCES_MOUNT = f"--mount=type=bind,source={SOURCES_CONTEXT},target={SOURCES_DIR}"
# apt's lists and cache of an offline RUN live in a tmpfs: the local repository's lists never reach a layer or the
# shared apt cache mounts of online builds.
OFFLINE_APT_DIR = "/tmp/imgbuild-apt"


def offline_apt_files(base_ref: str) -> list[tuple[str, str]]:
    """The apt configuration of an offline stage on `base_ref`: (context path, text) of its APT_CONFIG file (only the
    local repository of its .debs, lists and cache in the tmpfs) and its sources list (trusted=yes: the .debs were
    checked against the fetch's record, which apt's signed indexes vouched for when they were fetched)."""
    name = slug(base_ref)
    conf = "".join(
        f'{key} "{value}";\n'
        for key, value in {
            "Dir::Etc::SourceList": f"{SOURCES_DIR}/apt/{name}.list",
            "Dir::Etc::SourceParts": f"{SOURCES_DIR}/apt/none",
            "Dir::State::Lists": f"{OFFLINE_APT_DIR}/lists",
            "Dir::Cache": f"{OFFLINE_APT_DIR}/cache",
            "Acquire::Languages": "none",
        }.items()
    )
    listing = f"deb [trusted=yes] file:{SOURCES_DIR}/debs/{name} ./\n"
    return [(f"{SOURCES_CONTEXT}/apt/{name}.conf", conf), (f"{SOURCES_CONTEXT}/apt/{name}.list", listing)]


def apt_get_online(base_ref: str) -> str:
    """The head of a stage's apt-get RUN (up to `install ... \\`): apt's cache mounts, update, install."""
    return f"{run(*apt_mounts(base_ref))}apt-get update \\\n && apt-get install -y --no-install-recommends \\"


def apt_get_offline(base_ref: str) -> str:
    """The head of an offline stage's apt-get RUN: the sources mounted, apt pointed at them alone (APT_CONFIG)."""
    return (
        f"{run(SOURCES_MOUNT, f'--mount=type=tmpfs,target={OFFLINE_APT_DIR}')}"
        f"export APT_CONFIG={SOURCES_DIR}/apt/{slug(base_ref)}.conf \\\n"
        f" && mkdir -p {OFFLINE_APT_DIR}/lists/partial {OFFLINE_APT_DIR}/cache/archives/partial \\\n"
        " && apt-get update \\\n && apt-get install -y --no-install-recommends \\"
    )


# The version of an empty stand-in package: an epoch no archive version reaches, so apt never replaces it, and a name
# that says what it is wherever the package list shows it (`imgbuild sbom`, dpkg -l).
STUB_VERSION = "99:0+imgbuild.stub"


def stub_packages_run(stubs: Mapping[str, str]) -> str:
    """The RUN that installs an empty stand-in for each package of `stubs` (name -> why the image must not carry it,
    `Contribution.stub_packages`) before a stage's apt-get, so that a dependency naming it is satisfied and apt never
    fetches it: a package made by dpkg-deb from a control file alone, version STUB_VERSION, held. Empty when there
    are none."""
    if not stubs:
        return ""
    lines = ["# Empty stand-ins (dpkg-deb, version " + STUB_VERSION + ", held), never the real packages:"]
    lines += [f"#   {name}: {why}" for name, why in sorted(stubs.items())]
    steps = []
    for name in sorted(stubs):
        folder = f"/tmp/imgbuild-stub/{name}"
        control = (
            f"Package: {name}\\nVersion: {STUB_VERSION}\\nArchitecture: all\\nMaintainer: imgbuild\\n"
            f"Description: empty stand-in for {name} (imgbuild keeps it out of the image)\\n"
        )
        steps += [
            f"mkdir -p {folder}/DEBIAN",
            f"printf '{control}' >{folder}/DEBIAN/control",
            f"dpkg-deb --build {folder} {folder}.deb >/dev/null",
            f"dpkg -i {folder}.deb",
        ]
    steps += [f"apt-mark hold {' '.join(sorted(stubs))}", "rm -rf /tmp/imgbuild-stub"]
    return "\n".join(lines) + "\nRUN " + " \\\n && ".join(steps)


def run_offline(*mounts: str) -> str:
    """`run` of an offline build: a RUN that would download (it mounts the CA secret) mounts the sources too."""
    return run(*mounts, *([SOURCES_MOUNT] if CA_MOUNT in mounts else []))


def dockerfile_value(value: object) -> str:
    """A value Docker's ENV and LABEL read back exactly: in double quotes, with \\ " and $
    escaped, since Docker expands $VAR and ${VAR} in both (a JSON string would not do: Docker keeps its
    \\n, \\t and \\u00e9 as written). A line break cannot be written at all: the schema refuses it in
    recipes, and here it is an error rather than a broken instruction."""
    from imgbuild.core.fields import one_line

    text = str(value)
    try:
        one_line(text)
    except ValueError as exc:
        raise RenderError(f"cannot write {text!r} as a Dockerfile ENV/LABEL value: {exc}") from None
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def kvlines(mapping: Mapping[str, object], indent: str) -> str:
    """NAME="value" pairs of one ENV or LABEL instruction, one per line, sorted (the `kvlines` filter)."""
    return f" \\\n{indent}".join(f"{k}={dockerfile_value(v)}" for k, v in sorted(mapping.items()))


def template_filters() -> dict[str, Any]:
    """The Jinja filters the templates write with: `shquote` (a shell word), `kvlines` (ENV and LABEL pairs)."""
    return {"shquote": shlex.quote, "kvlines": kvlines}


def template_globals(offline: bool = False, local_files: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The Jinja globals the templates write with (the blocks add their own, `Block.template_globals`). `offline`:
    everything from SOURCES_DIR (`build --sources`); `local_files`: the downloads (by file name) that `--files`
    found, copied from SOURCES_DIR/files/ by `download`, the rest fetched as usual."""
    import jinja2

    return dict(
        run=run_offline if offline or local_files else run,
        apt_get=apt_get_offline if offline else apt_get_online,
        stub_packages_run=stub_packages_run,
        # offline builds: `download` copies SOURCES_DIR/files/<name>, pip installs from SOURCES_DIR/wheels
        sources_dir=SOURCES_DIR if offline else None,
        # `--files`: these downloads (by file name) are copied from SOURCES_DIR/files/ too, the others fetched
        local_files=local_files,
        local_dir=SOURCES_DIR,
        download_name=download_name,  # THE name a download is saved under
        ca_secret_id=CA_SECRET_ID,
        ca_mount=CA_MOUNT,
        pip_cache_mount=PIP_CACHE_MOUNT,
        pip_cache_dir=PIP_CACHE_DIR,
        pip_env=PIP_ENV,
        apt_mounts=apt_mounts,
        cache_mount=cache_mount,
        pip_install=jinja2.pass_context(pip_install),
        pip_wheel=jinja2.pass_context(pip_wheel),
        builder_base=builder_base,
        paths=paths,  # where things are in the image (paths.ENTRYPOINT, paths.IMAGE_ETC...)
    )
