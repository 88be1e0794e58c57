"""Pin every component of a recipe and prove the versions fit together, or say exactly why not.

`resolve()` is pure when every PyTorch release it meets is in the shipped table; for another release it
asks `lookup_torch` (by default the package index, through range requests on the wheel's METADATA).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from packaging.version import Version
from pydantic import BaseModel, ConfigDict

from imgbuild import compat
from imgbuild.errors import ImgbuildError, ResolveError
from imgbuild.recipe import LoadedRecipe, Recipe, display


class Pin(BaseModel):
    """One component, pinned: its version, where it comes from, and why that version."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: str | None
    source: str
    origin: str
    details: dict[str, str] = {}


class Resolved(BaseModel):
    """A recipe with every component pinned (what the lock file holds)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    recipe: Recipe
    recipe_digest: str
    base_ref: str
    pins: dict[str, Pin]
    warnings: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.recipe.name

    def version(self, component: str) -> str | None:
        pin = self.pins.get(component)
        return pin.version if pin else None


TorchLookup = Callable[[str], compat.TorchWheel]


def index_lookup(torch_version: str) -> compat.TorchWheel:
    """Read a PyTorch release's NCCL and CUDA pins from the package index (range requests)."""
    from imgbuild import pypi  # network edge: imported only when a release is not in the shipped table

    pins = pypi.torch_pins(torch_version)
    if pins.cuda_version is None:
        raise ResolveError(f"torch {torch_version}: its wheel pins no CUDA runtime (a CPU build?)")
    return compat.TorchWheel(pins.nccl_package, pins.nccl_version, pins.cuda_version)


def resolve(loaded: LoadedRecipe, *, lookup_torch: TorchLookup | None = index_lookup) -> Resolved:
    """Pin and check a loaded recipe. Raises ResolveError naming the file, the keys and the conflict."""
    return _Resolver(loaded, lookup_torch).run()


def _major(version: str) -> int:
    return int(version.split(".")[0])


def _mm(version: str) -> str:
    return ".".join(version.split(".")[:2])


class _Resolver:
    def __init__(self, loaded: LoadedRecipe, lookup_torch: TorchLookup | None) -> None:
        self.loaded = loaded
        self.r = loaded.recipe
        self.c = loaded.recipe.components
        self.lookup_torch = lookup_torch
        self.pins: dict[str, Pin] = {}
        self.warnings: list[str] = []
        self.os_id = f"{self.r.os.family}{self.r.os.version}"

    def fail(self, keys: str, message: str, hint: str | None = None) -> ResolveError:
        return ResolveError(f"{display(self.loaded.path)}: {keys}: {message}", hint=hint)

    def run(self) -> Resolved:
        base_ref = self._base()
        self._platform()
        torch = self._pytorch()
        self._gaudi()
        self._efa()
        self._libfabric()
        self._openmpi()
        self._python()
        self._nccl(torch)
        self._plugin()
        self._nccl_tests()
        self._simple()
        return Resolved(
            recipe=self.r,
            recipe_digest=self.loaded.digest,
            base_ref=base_ref,
            pins=dict(sorted(self.pins.items())),
            warnings=tuple(self.warnings),
        )

    # -- base and platform ------------------------------------------------------------------------------

    def _base(self) -> str:
        b = self.r.base
        if b.tag == "latest" and not b.latest_only:
            raise self.fail(
                "base.tag",
                "'latest' is not a pinned version",
                hint="use a versioned tag, or set base.latest_only: true with base.digest if the "
                "publisher offers only 'latest'",
            )
        if b.latest_only and b.digest is None:
            self.warnings.append(
                f"base image {b.image} publishes only '{b.tag}', so it is not pinned: add base.digest "
                f"(docker inspect --format '{{{{index .RepoDigests 0}}}}' {b.image}:{b.tag}) to pin it"
            )
        ref = f"{b.image}@{b.digest}" if b.digest else f"{b.image}:{b.tag}"
        self.pins["base"] = Pin(version=b.digest or b.tag, source="image", origin="recipe", details={"image": b.image})
        return ref

    def _platform(self) -> None:
        p, cuda = self.r.platform, self.r.cuda
        if p.accelerator != "nvidia":
            if cuda is not None:
                raise self.fail("cuda", f"only nvidia platforms take cuda, this one is '{p.accelerator}'")
            return
        assert cuda is not None and p.gpu_arch is not None  # the schema guarantees both
        arch = compat.ARCH[p.gpu_arch]
        if Version(cuda.version) < Version(arch.min_cuda):
            raise self.fail(
                "cuda.version",
                f"{p.gpu_arch} ({arch.gpu}) needs CUDA >= {arch.min_cuda}, got {cuda.version}",
            )
        if arch.max_cuda_major is not None and _major(cuda.version) > arch.max_cuda_major:
            raise self.fail(
                "cuda.version / platform.gpu_arch",
                f"{p.gpu_arch} ({arch.gpu}) needs CUDA <= {arch.max_cuda_major}.x, got {cuda.version} "
                f"(CUDA 13 dropped sm_70 and everything below sm_75)",
            )
        self.pins["cuda"] = Pin(version=cuda.version, source="base", origin="recipe", details={"gpu_arch": p.gpu_arch})

    # -- PyTorch and NCCL ---------------------------------------------------------------------------------

    def _pytorch(self) -> compat.TorchWheel | None:
        t = self.c.pytorch
        if t is None:
            return None
        if t.source == "base":
            self.pins["pytorch"] = Pin(version=t.version, source="base", origin="base image")
            return None
        wheel = compat.TORCH.get(t.version)
        origin = f"torch {t.version} wheel (shipped table)"
        if wheel is None:
            if self.lookup_torch is None:
                raise self.fail(
                    "components.pytorch.version",
                    f"torch {t.version} is not in the shipped table and index lookups are off",
                    hint=f"known releases: {', '.join(compat.TORCH)}",
                )
            try:
                wheel = self.lookup_torch(t.version)
            except ImgbuildError as exc:
                raise self.fail(
                    "components.pytorch.version",
                    f"torch {t.version} is not in the shipped table and the index lookup failed: {exc}",
                ) from None
            origin = f"torch {t.version} wheel METADATA (package index)"
        p, cuda = self.r.platform, self.r.cuda
        if p.accelerator == "nvidia":
            assert cuda is not None and p.gpu_arch is not None
            if _major(wheel.cuda) != _major(cuda.version):
                raise self.fail(
                    "components.pytorch.version / cuda.version",
                    f"torch {t.version} wheels are built for CUDA {wheel.cuda}, the base has CUDA "
                    f"{cuda.version}: the major versions must match",
                )
            if not compat.torch_wheel_has_arch(t.version, wheel.cuda, p.gpu_arch):
                gpu = compat.ARCH[p.gpu_arch].gpu
                raise self.fail(
                    "components.pytorch.version / platform.gpu_arch",
                    f"torch {t.version} wheels (CUDA {wheel.cuda}) have no {p.gpu_arch} kernels, so they "
                    f"don't run on {gpu}",
                    hint="V100 needs a PyTorch built for CUDA 12.6 or older (e.g. 2.7.1)",
                )
        self.pins["pytorch"] = Pin(
            version=t.version,
            source="pip",
            origin=origin,
            details={"cuda": wheel.cuda, "nccl": f"{wheel.nccl_package}=={wheel.nccl}"},
        )
        return wheel

    def _nccl(self, torch: compat.TorchWheel | None) -> None:
        n = self.c.nccl
        if n is None:
            return
        version = n.version
        origin = "recipe"
        if torch is not None:
            if version is not None and version != torch.nccl:
                raise self.fail(
                    "components.nccl.version",
                    f"{version} is not the NCCL that PyTorch {self.c.pytorch.version} pins "  # type: ignore[union-attr]
                    f"({torch.nccl_package}=={torch.nccl})",
                    hint="leave components.nccl.version out to take PyTorch's",
                )
            version = torch.nccl
            origin = f"= PyTorch {self.c.pytorch.version}'s pin"  # type: ignore[union-attr]
        if version is None:
            raise self.fail("components.nccl.version", "required when PyTorch is not in the recipe")
        details: dict[str, str] = {}
        if n.source == "wheel":
            package = n.package
            if package is None:
                if torch is not None:
                    package = torch.nccl_package
                elif self.r.cuda is not None:
                    package = f"nvidia-nccl-cu{_major(self.r.cuda.version)}"
                else:
                    package = "nvidia-nccl-cu12"
            if torch is not None and package != torch.nccl_package:
                raise self.fail(
                    "components.nccl.package",
                    f"{package} is not the package PyTorch pins ({torch.nccl_package})",
                )
            details["package"] = package
        else:
            if self.r.cuda is None:
                raise self.fail("components.nccl.source", "'build' needs CUDA (an nvidia platform)")
            details["prefix"] = n.prefix
            details["gencode"] = compat.gencode(self.r.platform.gpu_arch or "")
        self.pins["nccl"] = Pin(version=version, source=n.source, origin=origin, details=details)

    # -- fabric and MPI ------------------------------------------------------------------------------------

    def _gaudi(self) -> None:
        g = self.c.gaudi
        if g is None:
            if self.r.platform.accelerator == "gaudi":
                raise self.fail("components.gaudi", "a gaudi platform needs components.gaudi.version")
            return
        release = compat.GAUDI.get(g.version)
        if release is None:
            raise self.fail(
                "components.gaudi.version",
                f"Gaudi {g.version} is not in the shipped table (known: {', '.join(compat.GAUDI)})",
            )
        t = self.c.pytorch
        if t is None or t.version != release.pytorch:
            raise self.fail(
                "components.pytorch.version",
                f"Gaudi {g.version} ships PyTorch {release.pytorch}, got {t.version if t else 'none'}",
            )
        if t.source != "base":
            raise self.fail("components.pytorch.source", "Gaudi's PyTorch comes with the base image: 'base'")
        if self.os_id not in release.os:
            raise self.fail("os", f"Gaudi {g.version} supports {', '.join(release.os)}, got {self.os_id}")
        image = f"{self.r.base.image}:{self.r.base.tag}"
        if g.version not in image or f"pytorch-installer-{release.pytorch}" not in image:
            raise self.fail(
                "base.image",
                f"{image} is not Gaudi {g.version}'s PyTorch {release.pytorch} image "
                f"(expected .../{g.version}/.../pytorch-installer-{release.pytorch})",
            )
        self.pins["gaudi"] = Pin(version=g.version, source="base", origin="recipe")

    def _efa(self) -> None:
        e = self.c.efa
        if e is None:
            return
        release = compat.EFA.get(e.version)
        if release is None:
            self.warnings.append(
                f"EFA installer {e.version} is not in the shipped table: OS support and the bundled "
                "plugin version are unchecked"
            )
        elif self.os_id not in release.os:
            raise self.fail(
                "components.efa.version / os",
                f"EFA installer {e.version} supports {', '.join(release.os)}, not {self.os_id}",
            )
        if e.source == "base":
            gaudi = compat.GAUDI.get(self.c.gaudi.version) if self.c.gaudi else None
            if gaudi is not None and gaudi.efa != e.version:
                raise self.fail(
                    "components.efa.version",
                    f"Gaudi {self.c.gaudi.version}'s image has EFA {gaudi.efa}, got {e.version}",  # type: ignore[union-attr]
                )
        details = {"mpi": e.mpi, "check": "sha256" if e.sha256 else "signature"}
        if e.sha256:
            details["sha256"] = e.sha256
        else:
            details["key_fingerprint"] = compat.EFA_KEY_FINGERPRINT
        self.pins["efa"] = Pin(version=e.version, source=e.source, origin="recipe", details=details)

    def _from_efa(self, key: str, component: str) -> Pin:
        e = self.c.efa
        if e is None or e.minimal:
            raise self.fail(key, f"{component} from the EFA installer needs components.efa (not minimal)")
        return Pin(version=None, source="efa", origin=f"EFA installer {e.version}")

    def _libfabric(self) -> None:
        lf = self.c.libfabric
        if lf is None:
            return
        key = "components.libfabric"
        if lf.source == "efa":
            pin = self._from_efa(f"{key}.source", "libfabric")
            bundled = compat.EFA.get(self.c.efa.version) if self.c.efa else None
            version = bundled.libfabric if bundled else None
            if lf.version is not None and version is not None and lf.version != version:
                raise self.fail(f"{key}.version", f"EFA {self.c.efa.version} bundles {version}")  # type: ignore[union-attr]
            pin = pin.model_copy(update={"version": lf.version or version})
            self.pins["libfabric"] = pin.model_copy(update={"details": {"prefix": lf.prefix or "/opt/amazon/efa"}})
        elif lf.source == "distro":
            self.pins["libfabric"] = self._distro_pin(key, "libfabric", lf.version)
        else:
            if lf.version is None:
                raise self.fail(f"{key}.version", "required when libfabric comes with the base image")
            gaudi = compat.GAUDI.get(self.c.gaudi.version) if self.c.gaudi else None
            if gaudi is not None and gaudi.libfabric != lf.version:
                raise self.fail(f"{key}.version", f"Gaudi's image has libfabric {gaudi.libfabric}")
            details = {"prefix": lf.prefix} if lf.prefix else {}
            self.pins["libfabric"] = Pin(version=lf.version, source="base", origin="base image", details=details)

    def _distro_pin(self, key: str, what: str, wanted: str | None) -> Pin:
        distro = compat.DISTRO.get(self.os_id)
        if distro is None:
            raise self.fail(f"{key}.source", f"no package table for {self.os_id} (known: {list(compat.DISTRO)})")
        version = getattr(distro, what)
        if wanted is not None and wanted != version:
            raise self.fail(f"{key}.version", f"{self.os_id} ships {what} {version}, got {wanted}")
        return Pin(version=version, source="distro", origin=f"{self.os_id} package")

    def _openmpi(self) -> None:
        m = self.c.openmpi
        if m is None:
            return
        key = "components.openmpi"
        if m.source == "efa":
            pin = self._from_efa(f"{key}.source", "Open MPI")
            assert self.c.efa is not None
            prefix = m.prefix or ("/opt/amazon/openmpi5" if self.c.efa.mpi == "openmpi5" else "/opt/amazon/openmpi")
            self.pins["openmpi"] = pin.model_copy(update={"version": m.version, "details": {"prefix": prefix}})
        elif m.source == "distro":
            self.pins["openmpi"] = self._distro_pin(key, "openmpi", m.version)
        else:
            if m.version is None:
                raise self.fail(f"{key}.version", f"required when Open MPI comes from '{m.source}'")
            gaudi = compat.GAUDI.get(self.c.gaudi.version) if self.c.gaudi else None
            if gaudi is not None and m.source == "base" and gaudi.openmpi != m.version:
                raise self.fail(f"{key}.version", f"Gaudi's image has Open MPI {gaudi.openmpi}, got {m.version}")
            prefix = m.prefix or ("/opt/openmpi" if m.source == "source" else "")
            details = {"prefix": prefix} if prefix else {}
            self.pins["openmpi"] = Pin(version=m.version, source=m.source, origin="recipe", details=details)

    def _python(self) -> None:
        py = self.c.python
        if py is None:
            if (self.c.pytorch and self.c.pytorch.source == "pip") or (self.c.nccl and self.c.nccl.source == "wheel"):
                raise self.fail("components.python", "pip-installed components need components.python")
            return
        if py.source == "distro":
            pin = self._distro_pin("components.python", "python", py.version)
        else:
            if py.version is None:
                raise self.fail("components.python.version", "required when Python comes with the base image")
            pin = Pin(version=py.version, source="base", origin="base image")
        details = {"venv": py.venv} if py.venv else {}
        self.pins["python"] = pin.model_copy(update={"details": details})
        mp = self.c.mpi4py
        if mp is not None:
            if mp.source == "distro":
                self.pins["mpi4py"] = self._distro_pin("components.mpi4py", "mpi4py", mp.version)
            else:
                if mp.version is None:
                    raise self.fail("components.mpi4py.version", "required for pip")
                self.pins["mpi4py"] = Pin(version=mp.version, source="pip", origin="recipe")

    def _plugin(self) -> None:
        p = self.c.aws_ofi_nccl
        if p is None:
            return
        key = "components.aws_ofi_nccl"
        nccl = self.pins.get("nccl")
        if nccl is None or nccl.version is None:
            raise self.fail(key, "the NCCL plugin needs components.nccl")
        if self.c.efa is None:
            raise self.fail(key, "aws-ofi-nccl needs libfabric from components.efa")
        if p.source == "efa":
            release = compat.EFA.get(self.c.efa.version)
            bundled = release.plugin if release else None
            if bundled is None:
                raise self.fail(
                    f"{key}.source",
                    f"the aws-ofi-nccl version bundled with EFA installer {self.c.efa.version} is not in the "
                    "shipped table, so it can't be checked against NCCL",
                    hint="use source: release with a version, or an EFA installer whose bundle is known",
                )
            if p.version is not None and p.version != bundled:
                raise self.fail(f"{key}.version", f"EFA {self.c.efa.version} bundles {bundled}, got {p.version}")
            version, origin = bundled, f"bundled with EFA installer {self.c.efa.version}"
            details = {"prefix": "/opt/amazon/ofi-nccl"}
        else:
            if p.version is None:
                raise self.fail(f"{key}.version", "required for source: release")
            version, origin = p.version, "recipe"
            details = {"prefix": p.prefix, "tag": compat.plugin_tag(p.version)}
        series = _mm(version)
        tested = compat.PLUGIN_TESTED_NCCL.get(series)
        if tested is None:
            raise self.fail(
                f"{key}.version",
                f"aws-ofi-nccl {version} is not in the shipped table "
                f"(known series: {', '.join(compat.PLUGIN_TESTED_NCCL)})",
            )
        nv = Version(nccl.version)
        if nv > Version(tested):
            raise self.fail(
                f"{key}.version / components.nccl",
                f"aws-ofi-nccl {version} was tested with NCCL up to {tested}; NCCL {nccl.version} is newer",
                hint="use a newer aws-ofi-nccl release",
            )
        if nv < Version(compat.PLUGIN_OLDEST_NCCL):
            raise self.fail(
                f"{key}.version / components.nccl",
                f"aws-ofi-nccl {version} supports NCCL {compat.PLUGIN_OLDEST_NCCL} and later, got {nccl.version}",
            )
        details["tested_nccl"] = tested
        self.pins["aws_ofi_nccl"] = Pin(version=version, source=p.source, origin=origin, details=details)

    def _nccl_tests(self) -> None:
        t = self.c.nccl_tests
        if t is None:
            return
        nccl, mpi = self.pins.get("nccl"), self.pins.get("openmpi")
        if nccl is None or nccl.source != "build" or mpi is None or self.r.cuda is None:
            raise self.fail(
                "components.nccl_tests",
                "nccl-tests build against CUDA, an NCCL built from source and Open MPI",
            )
        self.pins["nccl_tests"] = Pin(
            version=t.version, source="release", origin="recipe", details={"prefix": t.prefix}
        )

    def _simple(self) -> None:
        s = self.c.sshd
        if s is not None:
            self.pins["sshd"] = Pin(
                version=None,
                source="distro",
                origin=f"{self.os_id} openssh-server",
                details={"ports": ",".join(str(p) for p in s.ports)},
            )
        sm = self.c.sagemaker
        if sm is not None:
            if s is None:
                raise self.fail("components.sagemaker", "SageMaker multi-node jobs need components.sshd")
            self.pins["sagemaker"] = Pin(
                version=None,
                source="imgbuild",
                origin="recipe",
                details={"launcher": sm.launcher, "ssh_port": str(sm.ssh_port)},
            )


def resolved_to_json(resolved: Resolved) -> dict[str, Any]:
    """The lock's content: pins and warnings, keyed and sorted for a stable file."""
    return {
        "recipe": resolved.name,
        "recipe_digest": resolved.recipe_digest,
        "base_ref": resolved.base_ref,
        "pins": {k: v.model_dump() for k, v in sorted(resolved.pins.items())},
        "warnings": list(resolved.warnings),
    }
