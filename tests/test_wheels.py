"""Wheels pinned by hash: pin.wheels.compile_sets against the real index (uv, as configured; marked network), the
pip steps that install a recorded set with --require-hashes, and a BuildKit build that refuses a wheel whose hash
differs."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, hadolint
from imgbuild import recipe
from imgbuild.blocks import context_for
from imgbuild.blocks.python import UV_BIN, UV_DIR
from imgbuild.core.errors import BuildError, IndexLookupError, ResolveError
from imgbuild.image import dockerfile, render
from imgbuild.pin import lock, pypi, record, resolver, wheels
from imgbuild.pin.content import Content, Download, Requirement
from localindex import Index, make_wheel

# nvidia-nccl-cu12 2.27.5's two wheels: manylinux2014_aarch64 and manylinux2014_x86_64
NCCL_2_27_5 = (
    "sha256:31432ad4d1fb1004eb0c56203dc9bc2178a1ba69d1d9e02d64a6938ab5e40e7a",
    "sha256:ad730cf15cb5d25fe849c6e6ca9eb5b76db16a80f13f425ac68d8e2e55624457",
)
HASH = "sha256:{:064x}"  # a made-up hash
MPI4PY_4_1_2_SDIST = "sha256:56860286dc45f20e8821e93cb06669e30462348bf866f685553fa4b712d58d02"


def resolved_of(name: str) -> resolver.Resolved:
    return resolver.resolve(recipe.load(name), lookup_torch=None)


# ------------------------------------------------------------------------------------------------------------
# compile_sets, for real


def test_the_target_is_the_images_python_and_glibc() -> None:
    assert wheels.target(resolved_of("pytorch")) == ("3.11", "x86_64-manylinux_2_36")  # Debian 12
    assert wheels.target(resolved_of("a100")) == ("3.10", "x86_64-manylinux_2_35")  # Ubuntu 22.04
    assert wheels.target(resolved_of("h100")) == ("3.12", "x86_64-manylinux_2_39")  # Ubuntu 24.04
    assert wheels.target(resolved_of("cpu"), "arm64") == ("3.11", "aarch64-manylinux_2_36")


@pytest.mark.network  # uv asks the real index
def test_nccl_alone_is_one_wheel_per_architecture_with_its_hash() -> None:
    """cpu is built for amd64 and arm64: the requirement holds the hash of each architecture's wheel."""
    out = wheels.compile_sets({"nccl": ["nvidia-nccl-cu12==2.27.5"]}, resolved_of("cpu"))
    assert out == {"nccl": (Requirement(name="nvidia-nccl-cu12", version="2.27.5", hashes=NCCL_2_27_5),)}
    amd64_only = resolved_of("pytorch")  # one architecture: its wheel alone
    out = wheels.compile_sets({"nccl": ["nvidia-nccl-cu12==2.27.5"]}, amd64_only)
    assert out["nccl"][0].hashes == (NCCL_2_27_5[1],)


@pytest.mark.network  # uv asks the real index
def test_a_release_without_a_wheel_for_one_architecture_names_it() -> None:
    """nvidia-nccl-cu12 2.21.5 has no aarch64 wheel: a recipe built for arm64 cannot install it."""
    with pytest.raises(ResolveError) as err:
        wheels.compile_sets({"nccl": ["nvidia-nccl-cu12==2.21.5"]}, resolved_of("cpu"))
    assert "cpu: requirement set nccl" in str(err.value) and "aarch64-manylinux_2_36" in str(err.value)


@pytest.mark.network  # uv asks the real index
def test_torchs_two_layers_are_disjoint_and_together_its_closure() -> None:
    resolved = resolved_of("pytorch")
    torch = resolved.pins["pytorch"].details
    layers = {"pytorch/cuda": list(torch.cuda_wheels), "pytorch/torch": ["torch==2.9.1", f"numpy=={torch.numpy}"]}
    out = wheels.compile_sets(layers, resolved)
    cuda, rest = ({r.name: r for r in out[name]} for name in layers)
    whole = {r.name: r for r in wheels.compile_sets({"all": layers["pytorch/torch"]}, resolved)["all"]}
    assert not cuda.keys() & rest.keys()
    assert {**cuda, **rest} == whole  # same names, versions and hashes
    assert {"torch", "numpy", "triton"} <= rest.keys() and "nvidia-nccl-cu12" in cuda
    assert all(r.name.startswith("nvidia-") for r in cuda.values())
    assert all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for r in whole.values() for h in r.hashes)


@pytest.mark.network  # uv asks the real index
def test_the_recipes_sets_install_builder_stage_first_each_holding_what_the_earlier_do_not() -> None:
    resolved = resolved_of("a100")
    sets = record.requirement_sets(resolved)
    registry = ["nccl", "python/uv", "pytorch/cuda", "pytorch/torch", "mpi4py/build", "mpi4py", "sagemaker"]
    assert list(sets) == registry
    out = wheels.compile_sets(sets, resolved)
    # uv installs apart from the venv (resolved first); mpi4py builds in the builder stage, whose venv the runtime
    # stage copies before PyTorch's layers
    assert list(out) == ["python/uv", "nccl", "mpi4py/build", "mpi4py", "pytorch/cuda", "pytorch/torch", "sagemaker"]
    names = [r.name for reqs in out.values() for r in reqs]
    assert len(names) == len(set(names))
    assert "nvidia-nccl-cu12" not in {r.name for r in out["pytorch/cuda"]}  # the nccl set holds it
    assert {r.name for r in out["mpi4py/build"]} == {"setuptools", "cython"}
    # from source: the sdist's hash alone
    assert out["mpi4py"] == (Requirement(name="mpi4py", version="4.1.2", hashes=(MPI4PY_4_1_2_SDIST,)),)


@pytest.mark.network  # uv asks the real index
def test_an_unresolvable_set_names_the_recipe_the_set_and_uvs_message() -> None:
    with pytest.raises(ResolveError) as err:
        wheels.compile_sets({"nccl": ["nvidia-nccl-cu12==0.0.0.1"]}, resolved_of("cpu"))
    text = str(err.value)
    assert "cpu: requirement set nccl" in text and "nvidia-nccl-cu12==0.0.0.1" in text
    assert "No solution found" in text and "Python 3.11 on x86_64-manylinux_2_36" in text


def test_an_unreachable_index_is_an_index_lookup_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("IMGBUILD_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens on the discard port
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    monkeypatch.setenv("UV_HTTP_RETRIES", "0")
    with pytest.raises(IndexLookupError) as err:
        wheels.compile_sets({"nccl": ["nvidia-nccl-cu12==2.27.5"]}, resolved_of("cpu"))
    assert "cpu: requirement set nccl" in str(err.value) and "uv pip compile failed" in str(err.value)


@pytest.mark.parametrize("variable", ["IMGBUILD_INDEX_URL", "PIP_INDEX_URL"])
def test_uv_and_the_page_reader_read_the_one_configured_index(
    variable: str, index_env: Index, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """One index configuration: uv resolves from the index imgbuild reads (IMGBUILD_INDEX_URL, else pip's), not from
    uv's own settings, which here name a port nothing listens on."""
    data = make_wheel(tmp_path, "onedex-1.0-py3-none-any.whl", [], junk=0)
    index_env.add_wheel("onedex", "onedex-1.0-py3-none-any.whl", data)
    monkeypatch.delenv("IMGBUILD_INDEX_URL")
    monkeypatch.setenv(variable, index_env.simple)
    for uvs_own in ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "UV_INDEX", "UV_EXTRA_INDEX_URL"):
        monkeypatch.setenv(uvs_own, "http://127.0.0.1:9/simple")
    assert pypi.releases("onedex") == ["1.0"]  # the page reader
    sets = wheels.compile_sets({"onedex": ["onedex==1.0"]}, resolved_of("cpu"))  # uv
    (req,) = sets["onedex"]
    assert (req.name, req.version, req.hashes) == ("onedex", "1.0", (f"sha256:{hashlib.sha256(data).hexdigest()}",))
    assert any(path == "/files/onedex-1.0-py3-none-any.whl" for _, path, _ in index_env.wheel_requests())


def test_uv_runs_no_interpreter_from_path(index_env: Index, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The target is given (--python-version, --python-platform); the interpreter that runs imgbuild is the one uv
    may build metadata with. Left to find one, uv ran every python on PATH that might be the target's version (about
    a second per set with pyenv's shims): here, a python3.11 and a python3 on PATH that record being run."""
    data = make_wheel(tmp_path, "onedex-1.0-py3-none-any.whl", [], junk=0)
    index_env.add_wheel("onedex", "onedex-1.0-py3-none-any.whl", data)
    bin_dir, ran = tmp_path / "bin", tmp_path / "ran"
    bin_dir.mkdir()
    for name in ("python3.11", "python3", "python"):
        (bin_dir / name).write_text(f'#!/bin/sh\necho "$0" >> {ran}\nexec {sys.executable} "$@"\n')
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    monkeypatch.delenv("UV_PYTHON", raising=False)
    sets = wheels.compile_sets({"onedex": ["onedex==1.0"]}, resolved_of("cpu"))
    assert [r.name for r in sets["onedex"]] == ["onedex"]
    assert not ran.exists(), f"uv ran {ran.read_text()}"


def test_no_uv_is_an_error_that_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    import uv

    def missing() -> str:
        raise FileNotFoundError("no uv binary here")

    monkeypatch.setattr(uv, "find_uv_bin", missing)
    with pytest.raises(IndexLookupError, match=r"uv is needed .* no uv binary here"):
        wheels.compile_sets({"nccl": ["nvidia-nccl-cu12==2.27.5"]}, resolved_of("cpu"))


def test_no_binary_entries() -> None:
    specs = ["--no-binary=mpi4py", "mpi4py==4.0.3", "--no-binary Foo_Bar,baz"]
    assert wheels.no_binary(specs) == ["mpi4py", "foo-bar", "baz"]
    assert wheels.requirement_lines(specs) == ["mpi4py==4.0.3"]


# ------------------------------------------------------------------------------------------------------------
# rendering (no network: made-up hashes)


def fake_content(resolved: resolver.Resolved) -> Content:
    """Content with a made-up hash per requirement of each set and per download."""
    python = {
        name: tuple(
            Requirement(
                name=spec.split("==")[0].split("[")[0], version=spec.split("==")[1], hashes=(f"sha256:{i:064x}",)
            )
            for i, spec in enumerate(wheels.requirement_lines(specs))
            if "==" in spec
        )
        or (Requirement(name="setuptools", version="80.0.0", hashes=("sha256:" + "a" * 64,)),)
        for name, specs in record.requirement_sets(resolved).items()
    }
    downloads = {url: Download(url=url, sha256="b" * 64, origin="test") for url in record.downloads(resolved)}
    return Content(python=python, downloads=downloads)


def plan_with_content(name: str) -> render.BuildPlan:
    resolved = resolved_of(name)
    return render.plan(resolved.model_copy(update={"content": fake_content(resolved)}))


def pip_runs(dockerfile: str) -> list[str]:
    """Every RUN (joined over its continuation lines) that runs pip or uv's pip."""
    runs: list[str] = []
    for line in dockerfile.splitlines():
        if line.startswith("RUN "):
            runs.append(line)
        elif runs and runs[-1].endswith("\\") and (line.startswith("    ") or line.startswith(" &&")):
            runs[-1] += "\n" + line
    return [r for r in runs if "/bin/pip " in r or "/bin/uv pip " in r]


@pytest.mark.parametrize("name", ["cpu", "a100", "debian-cuda"])
def test_the_run_installing_boto3_removes_its_credential_shaped_docs(name: str) -> None:
    """boto3's examples and botocore's examples-1.json (AWS's example access key, a private-key header) go in the
    RUN that installs them, so no layer holds them; the shipped lock's closure says which set that is, and no other
    set's RUN removes anything."""
    _, resolved = lock.for_ref(name)  # the shipped lock, its content
    assert resolved.content is not None
    holding = {n for n, reqs in resolved.content.python.items() if {"boto3", "botocore"} & {r.name for r in reqs}}
    plan = render.plan(resolved)
    assert holding == {"sagemaker"}
    for run in pip_runs(plan.dockerfile):
        removes = 'rm -rf -- "$site"/boto3/examples "$site"/botocore/data/*/*/examples-1.json'
        if "/requirements/sagemaker.txt" in run:
            assert run.endswith(removes) and 'site="$(/opt/venv/bin/python -c' in run, run
        else:
            assert "rm -rf" not in run, run


@pytest.mark.parametrize("name", ["a100", "pytorch", "cpu"])
def test_every_pip_step_installs_a_hashed_requirements_file(name: str) -> None:
    """Each set installs from the lock's file with --require-hashes --no-deps: with uv in one command (parallel
    downloads into its cache mount, bytecode compiled, into the venv's Python), with pip (download, then install
    --no-index) for uv itself and a set built from its sdist."""
    plan = plan_with_content(name)
    files = {f.path: f.content.decode() for f in plan.files}
    runs = pip_runs(plan.dockerfile)
    sets = record.requirement_sets(resolved_of(name))
    assert len(runs) == len(sets) and runs
    assert "python/uv" in sets
    for run in runs:
        mount = re.search(r"--mount=type=bind,source=(imgbuild/\S+),target=(\S+)", run)
        assert mount, run
        source, target = mount.groups()
        assert source in files and target.startswith(dockerfile.REQUIREMENTS_DIR + "/")
        assert all(
            re.fullmatch(r"\S+==\S+ \\|    --hash=sha256:[0-9a-f]{64}( \\)?", ln) for ln in files[source].splitlines()
        )
        if "/bin/uv pip install" in run:
            assert run.count("--require-hashes --no-deps -r") == 1 and run.count(f"-r {target}") == 1, run
            assert f"{UV_BIN} pip install --python /opt/venv/bin/python --link-mode=copy --compile-bytecode" in run
            assert dockerfile.UV_CACHE_MOUNT in run and dockerfile.PIP_CACHE_MOUNT not in run and "/bin/pip " not in run
            assert f"SSL_CERT_FILE={dockerfile.CA_SECRET_PATH} " in run and dockerfile.CA_MOUNT in run
        else:  # uv itself, or a set built from its sdist
            assert "python.uv.txt" in source or "--no-binary=" in run, run
            assert run.count("--require-hashes --no-deps") == 2 and run.count(f"-r {target}") == 2
            assert "--no-index" in run
        assert "No lock content" not in plan.dockerfile
    for set_name in sets:
        assert dockerfile.requirements_path(set_name) in files


def test_uv_comes_from_the_builder_stage_and_is_in_no_runtime_layer() -> None:
    """The builder stage's pip installs the lock's uv (hashed) apart from the venv; every runtime-stage install
    mounts it from there read-only, and nothing copies it into the runtime stage; pip installs no set there."""
    text = plan_with_content("pytorch").dockerfile
    builder, runtime = text.split("# ---- runtime")
    (uv,) = [r for r in pip_runs(builder) if "python.uv.txt" in r]
    assert f"/opt/venv/bin/pip install --no-index --find-links {dockerfile.WHEELHOUSE} --target {UV_DIR} " in uv
    assert "--require-hashes --no-deps -r /tmp/imgbuild-requirements/python.uv.txt" in uv
    assert builder.index("python.uv.txt") < builder.index(f"{UV_BIN} pip install")  # before the first use
    runs = pip_runs(runtime)
    assert len(runs) == 3 and all(f"{UV_BIN} pip install" in r for r in runs)
    mount = f"--mount=type=bind,from=builder,source={UV_DIR},target={UV_DIR}"
    assert all(mount in r for r in runs)
    steps = [line for line in runtime.splitlines() if UV_DIR in line]
    assert all(line.strip().startswith((mount, f"SSL_CERT_FILE={dockerfile.CA_SECRET_PATH} ")) for line in steps), steps
    assert not any(line.startswith("COPY") and "imgbuild-uv" in line for line in runtime.splitlines())


def test_without_a_venv_or_lock_content_pip_installs_every_set() -> None:
    """uv needs the venv's pip to come in (and the lock to pin it): a recipe without a venv declares no uv set and
    installs its sets with pip, as one rendered without lock content does."""
    resolved = resolved_of("cpu")
    py = resolved.pins["python"]
    bare = resolved.model_copy(
        update={
            "pins": {
                **resolved.pins,
                "python": py.model_copy(update={"details": py.details.model_copy(update={"prefix": None})}),
            }
        }
    )
    assert "python/uv" not in record.requirement_sets(bare) and "nccl" in record.requirement_sets(bare)
    assert "python/uv" in record.requirement_sets(resolved)
    assert "uv pip install" not in render.plan(resolved).dockerfile  # no content: unhashed, with pip


def test_mpi4py_builds_its_hashed_sdist_without_build_isolation() -> None:
    runs = pip_runs(plan_with_content("a100").dockerfile)
    build, source = (r for r in runs if "mpi4py" in r)
    assert "mpi4py.build.txt" in build and "--no-binary" not in build and f"{UV_BIN} pip install" in build
    assert "mpi4py.txt" in source and source.count("--no-binary=mpi4py --no-build-isolation") == 2
    assert 'CFLAGS="-O2 -g0" MPICC=/opt/amazon/openmpi/bin/mpicc /opt/venv/bin/pip install' in source
    assert "imgbuild-pip-wheels-mpi4py-" in source


@pytest.mark.parametrize("name", ["a100", "pytorch"])
def test_hashed_pip_steps_are_hadolint_clean(name: str) -> None:
    proc = subprocess.run(
        [hadolint(), "--config", str(REPO / ".hadolint.yaml"), "--no-color", "-"],
        input=plan_with_content(name).dockerfile, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_without_lock_content_the_pip_steps_say_they_are_unhashed() -> None:
    dockerfile = render.plan(resolved_of("pytorch")).dockerfile
    assert "# No lock content: requirement set pytorch/torch installs unhashed" in dockerfile
    assert "--require-hashes" not in dockerfile
    assert "pip download --dest /root/.cache/pip/imgbuild-wheelhouse torch==2.9.1 numpy==2.2.6" in dockerfile


def context_of(name: str, content: Content | None) -> Any:
    resolved = resolved_of(name)
    return context_for(resolved.model_copy(update={"content": content}))


def test_a_sources_folder_installs_with_no_download() -> None:
    resolved = resolved_of("a100")
    ctx = context_for(resolved.model_copy(update={"content": fake_content(resolved)}))
    jinja = {"run": dockerfile.run, "sources_dir": "/imgbuild-sources"}
    text = dockerfile.pip_install(jinja, "/opt/venv/bin/pip", ctx, "mpi4py", build_env="CFLAGS=-O2")
    assert "download" not in text
    assert text.endswith(
        "CFLAGS=-O2 /opt/venv/bin/pip install --no-index --find-links /imgbuild-sources/wheels --require-hashes "
        "--no-deps --no-binary=mpi4py --no-build-isolation -r /tmp/imgbuild-requirements/mpi4py.txt"
    )


def test_a_sources_folder_installs_with_uv_from_its_wheels_alone() -> None:
    """Offline (`build --sources`), uv installs from the folder's wheels with --no-index (and --offline), hashed; pip
    installs uv itself from there too."""
    resolved = resolved_of("pytorch")
    ctx = context_for(resolved.model_copy(update={"content": fake_content(resolved)}))
    jinja = {"run": dockerfile.run_offline, "sources_dir": "/imgbuild-sources"}
    text = dockerfile.pip_install(jinja, "/opt/venv/bin/pip", ctx, "pytorch/torch", dockerfile.PIP_ENV)
    assert "download" not in text and dockerfile.SOURCES_MOUNT in text
    assert text.endswith(
        f"{UV_BIN} pip install --python /opt/venv/bin/python --link-mode=copy --compile-bytecode "
        "--no-index --offline --find-links /imgbuild-sources/wheels --require-hashes --no-deps "
        "-r /tmp/imgbuild-requirements/pytorch.torch.txt"
    )
    uv = dockerfile.pip_install(jinja, "/opt/venv/bin/pip", ctx, "python/uv", target=UV_DIR)
    assert "download" not in uv and uv.endswith(
        f"/opt/venv/bin/pip install --no-index --find-links /imgbuild-sources/wheels --target {UV_DIR} "
        "--require-hashes --no-deps -r /tmp/imgbuild-requirements/python.uv.txt"
    )


def test_a_set_the_lock_lacks_is_a_render_error() -> None:
    from imgbuild.core.errors import RenderError

    resolved = resolved_of("cpu")
    ctx = context_for(resolved.model_copy(update={"content": Content()}))
    with pytest.raises(RenderError, match=r"no requirement set 'nccl'.*imgbuild lock"):
        dockerfile.pip_install({"run": dockerfile.run}, "pip", ctx, "nccl")


# ------------------------------------------------------------------------------------------------------------
# BuildKit: pip refuses a wheel whose hash is not the requirements file's


@pytest.mark.docker
def test_a_build_refuses_a_wheel_with_another_hash(docker_client: Any, tmp_path: Path) -> None:
    from imgbuild.build import builders, dockercontext

    resolved = resolved_of("cpu")
    real = wheels.compile_sets({"nccl": ["six==1.17.0", "idna==3.10"]}, resolved)["nccl"]
    six, idna = sorted(real, key=lambda r: r.name != "six")
    wrong = "sha256:" + "0" * 64
    content = Content(python={"nccl": (six, idna.model_copy(update={"hashes": (wrong,)}))})
    ctx = context_for(resolved.model_copy(update={"content": content}))
    # the nccl block's set, holding two small wheels here: the RUN is pip_install's, as every recipe renders it (uv,
    # which the builder stage gets from the lock's set python/uv: here pip puts the lock's uv release where it goes)
    step = dockerfile.pip_install({"run": dockerfile.run}, "/opt/venv/bin/pip", ctx, "nccl", dockerfile.PIP_ENV)
    assert f"{UV_BIN} pip install" in step, step
    (tmp_path / "Dockerfile").write_text(
        "FROM debian:bookworm-slim\n"
        'SHELL ["/bin/bash", "-o", "pipefail", "-c"]\n'
        f"{dockerfile.run(*dockerfile.apt_mounts('debian:bookworm-slim'))}apt-get update \\\n"
        " && apt-get install -y --no-install-recommends python3-venv \\\n"
        " && python3 -m venv /opt/venv\n"
        f"{dockerfile.run(dockerfile.CA_MOUNT)}PIP_CERT={dockerfile.CA_SECRET_PATH} /opt/venv/bin/pip install "
        f"--target {UV_DIR} uv==0.13.9\n"
        f"ARG NONCE\n{step}\n"
    )
    for f in render.requirement_files(ctx):
        (tmp_path / f.path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f.path).write_bytes(f.content)
    bundle = os.environ.get("IMGBUILD_CA_BUNDLE") or next(
        (p for p in ("/etc/ssl/certs/ca-certificates.crt",) if Path(p).is_file()), None
    )
    tag = f"imgbuild-test/wheels:{uuid.uuid4().hex[:12]}"
    try:
        with (
            dockercontext.temp_secrets(
                {dockerfile.CA_SECRET_ID: dockercontext.ca_secret(Path(bundle) if bundle else None)}
            ) as s,
            pytest.raises(BuildError) as err,
        ):
            builders.build(
                builders.select(), docker_client, tmp_path, tags=[tag], secrets=s,
                build_args={"NONCE": uuid.uuid4().hex}, log_path=tmp_path / "build.log",
            )  # fmt: skip
        log = (tmp_path / "build.log").read_text()
        out = str(err.value) + log
        # uv names the distribution and both hashes: the requirements file's and the file's own
        assert re.search(r"[Hh]ash mismatch for `idna==3\.10`", out), out[-4000:]
        assert wrong in out and idna.hashes[0] in out, out[-4000:]
    finally:
        import docker.errors

        with contextlib.suppress(docker.errors.ImageNotFound):
            docker_client.images.remove(tag, force=True)


def test_one_request_to_the_index_meets_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """uv's UV_HTTP_TIMEOUT at lock time and pip download's --timeout in `sources fetch` follow one rule: the
    user's per-request timeout or uv's 30 s, lowered to IMGBUILD_INDEX_DEADLINE."""
    monkeypatch.delenv("UV_HTTP_TIMEOUT", raising=False)
    monkeypatch.delenv("IMGBUILD_INDEX_DEADLINE", raising=False)
    assert wheels.request_timeout() == 30
    monkeypatch.setenv("IMGBUILD_INDEX_DEADLINE", "5")
    assert wheels.request_timeout() == 5
    monkeypatch.setenv("UV_HTTP_TIMEOUT", "3")
    assert wheels.request_timeout() == 3
    assert wheels.uv_deadline()[1] == {"UV_HTTP_TIMEOUT": "3"}
