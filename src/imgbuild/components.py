"""Components: the building blocks of an image.

Each block reads its parameters (from the recipe schema) and its pin (from the resolver) and contributes:
Debian packages for the builder and runtime stages, a Dockerfile fragment for each stage (Jinja macros
`builder` and `runtime` in images/components/<name>.j2), PATH / LD_LIBRARY_PATH entries, environment
variables and a manifest entry (`docker run` flags come from the recipe's runtime section: runprofile.py).
The target (OS, CUDA, GPU) is passed in, never global.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from packaging.version import Version

from imgbuild import compat
from imgbuild.resolver import Pin, Resolved

# Layer order: what changes least goes first, so bumping a component rebuilds only what follows it.
# Builder stage: toolchains and downloads, then the compiled parts in dependency order.
BUILDER_ORDER = ("efa", "openmpi", "python", "nccl", "aws_ofi_nccl", "nccl_tests", "pytorch")
# Runtime stage: base, OS, EFA/libfabric, MPI, NCCL, plugin, tests, Python (+PyTorch), then the parts that
# change most often: environment, sshd and entrypoint, SageMaker, manifest, labels.
RUNTIME_ORDER = (
    "efa", "libfabric", "openmpi", "nccl", "aws_ofi_nccl", "nccl_tests", "python", "pytorch", "mpi4py",
    "gaudi", "sshd", "sagemaker",
)  # fmt: skip


@dataclass(frozen=True)
class Context:
    """Facts about the target that several blocks need (paths other blocks produce)."""

    resolved: Resolved
    cuda_home: str | None
    gencode: str | None
    mpi_home: str | None
    libfabric_prefix: str | None
    venv: str | None
    python: str  # interpreter that pip-installed packages run under
    efa_in_builder: bool


@dataclass
class Contribution:
    """What one block adds to the image."""

    name: str
    builder_packages: set[str] = field(default_factory=set)
    runtime_packages: set[str] = field(default_factory=set)
    path: list[str] = field(default_factory=list)
    ld_library_path: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)


def context_for(resolved: Resolved) -> Context:
    """Derive the shared paths of a resolved recipe."""
    r, pins = resolved.recipe, resolved.pins
    mpi = pins.get("openmpi")
    mpi_home: str | None = None
    if mpi is not None:
        mpi_home = mpi.details.get("prefix") or (
            "/usr/lib/x86_64-linux-gnu/openmpi" if mpi.source == "distro" else None
        )
    lf = pins.get("libfabric")
    lf_prefix = None
    if lf is not None:
        lf_prefix = lf.details.get("prefix") or ("/usr" if lf.source == "distro" else None)
    elif "efa" in pins:
        lf_prefix = "/opt/amazon/efa"
    py = pins.get("python")
    venv = py.details.get("venv") if py else None
    plugin = pins.get("aws_ofi_nccl")
    efa_in_builder = (
        "efa" in pins
        and pins["efa"].source == "installer"
        and ("nccl_tests" in pins or (plugin is not None and plugin.source == "release"))
    )
    return Context(
        resolved=resolved,
        cuda_home=r.cuda.home if r.cuda else None,
        gencode=compat.gencode(r.platform.gpu_arch) if r.platform.gpu_arch else None,
        mpi_home=mpi_home,
        libfabric_prefix=lf_prefix,
        venv=venv,
        python=f"{venv}/bin/python" if venv else "python3",
        efa_in_builder=efa_in_builder,
    )


def contribute(name: str, pin: Pin, ctx: Context) -> Contribution:
    """The packages, paths, environment and manifest entry of one block."""
    c = Contribution(name=name)
    c.manifest = {"version": pin.version, "source": pin.source, "origin": pin.origin, **pin.details}
    if name == "efa":
        if pin.source == "installer":
            c.builder_packages |= {"curl", "ca-certificates", "gnupg"}
        mpi_bin = "/opt/amazon/openmpi5/bin" if pin.details.get("mpi") == "openmpi5" else "/opt/amazon/openmpi/bin"
        c.path += [mpi_bin, "/opt/amazon/efa/bin"] if pin.source == "installer" else []
        c.ld_library_path += ["/opt/amazon/efa/lib"] if pin.source == "installer" else []
    elif name == "libfabric":
        if pin.source == "distro":
            c.runtime_packages |= {"libfabric1", "libfabric-bin"}
        elif pin.source == "base" and ctx.libfabric_prefix:
            c.env["LIBFABRIC_ROOT"] = ctx.libfabric_prefix
            c.path.append(f"{ctx.libfabric_prefix}/bin")
            c.ld_library_path.append(f"{ctx.libfabric_prefix}/lib")
    elif name == "openmpi":
        if pin.source == "distro":
            c.runtime_packages |= {"openmpi-bin"}
        elif pin.source == "source":
            c.builder_packages |= {"curl", "ca-certificates", "build-essential", "bzip2"}
            c.path.append(f"{ctx.mpi_home}/bin")
            c.ld_library_path.append(f"{ctx.mpi_home}/lib")
        elif pin.source == "base" and ctx.mpi_home:
            c.env["MPI_ROOT"] = ctx.mpi_home
            c.path.append(f"{ctx.mpi_home}/bin")
        c.runtime_packages.add("openssh-client")  # mpirun starts remote daemons over ssh
    elif name == "python":
        c.runtime_packages |= {"python3"} if pin.source == "distro" else set()
        if ctx.venv:
            c.builder_packages |= {"python3-venv", "ca-certificates"}
            c.runtime_packages.add("python3-venv")
            c.path.append(f"{ctx.venv}/bin")
    elif name == "mpi4py" and pin.source == "distro":
        c.runtime_packages.add("python3-mpi4py")
    elif name == "nccl":
        if pin.source == "build":
            c.builder_packages |= {"curl", "ca-certificates", "build-essential"}
            c.ld_library_path.append(f"{pin.details['prefix']}/lib")
            c.env["NCCL_HOME"] = pin.details["prefix"]
    elif name == "aws_ofi_nccl":
        prefix = pin.details["prefix"]
        if pin.source == "release":
            c.builder_packages |= {"curl", "ca-certificates", "build-essential", "libhwloc-dev"}
            c.runtime_packages.add("libhwloc15")
            c.ld_library_path.append(f"{prefix}/lib")
        else:
            # The EFA installer's plugin moved between lib/x86_64-linux-gnu (<= 1.43) and lib/ (1.44+).
            c.ld_library_path += [f"{prefix}/lib", f"{prefix}/lib/x86_64-linux-gnu"]
        if Version(pin.version or "0") >= Version("1.15"):
            c.env["NCCL_NET_PLUGIN"] = "ofi"
    elif name == "nccl_tests":
        c.path.append(pin.details["prefix"])
    elif name == "sshd":
        c.runtime_packages.add("openssh-server")
        c.manifest["ports"] = [int(p) for p in pin.details["ports"].split(",")]
    return c


def dedupe(items: list[str]) -> list[str]:
    """Keep the first occurrence of each item, in order."""
    seen: set[str] = set()
    return [i for i in items if not (i in seen or seen.add(i))]  # type: ignore[func-returns-value]
