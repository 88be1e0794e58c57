"""What a building block is: a small protocol, and the capabilities a block adds only where it has them.

Every block is a subclass of `Block` with one instance, `BLOCK`, in its module: its name, its recipe options, the
source modes it accepts, its pin rule (`resolve`) and what a pin contributes to the image (`contribute`), plus a few
declared facts with defaults (what it provides, which blocks it follows, its part of the image's tag). Everything
else a block may do is a capability of its own, a mixin the block names in its class line, so the line says what
the block does and the code that uses a capability asks `isinstance(block, Downloads)`:

    Downloads     URLs its fragments download (`imgbuild lock` records a sha256 for each)
    PythonSets    requirement sets that `imgbuild lock` resolves with hashes and its template installs
    PythonDists   Python distributions its pin puts in the image outside pip (constraints for the sets)
    ShipsFiles    files its fragments COPY, and data files made from its pin and the image's manifest
    UserCode      the user's own tree (the `app` block): context files, a digest the image's tags fold in, an
                  entry in the image's manifest
    RecipeRules   why a recipe without it is wrong, a rule its options keep with the rest of the recipe
    Released      its release rows (blocks/<name>/releases.yaml) and how `lock` reads its publisher's archive
    Tracks        where `imgbuild outdated` looks for its newer releases

This is repo2docker's buildpack (a class whose methods add what it has) with hpccm's small building blocks: a block
written as a class shows what it overrides, where a record of ~25 callbacks showed, in every block, the ones it
leaves empty.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from imgbuild.blocks._core import Artifact, Context, Contribution, Details, Pin, Provides, Resolution, Tracked

if TYPE_CHECKING:
    from imgbuild.blocks._releases import ReleaseFile
    from imgbuild.core.fields import Strict


class Block(ABC):
    """One building block of an image, the part every block has.

    name         the key under `components:` in a recipe (or, with `top_level`, the recipe's own key `<name>`);
    options      its pydantic model (parameters with defaults; unknown keys are errors);
    modes        each source mode it accepts and how that mode reaches the image (`Provides`);
    details      its typed pin details (a `Details` subclass): what its pin rule decided, for everything after it;
    provides     what else it installs that other blocks may ask for by name (`Context.prefix`), e.g. efa: libfabric;
    after        blocks whose pins its rule reads (they resolve first);
    build_after  blocks whose builder output its builder fragment uses (their fragments come first);
    tag          (rank, short name) for the readable image tag, None to leave it out;
    node_checks  the ids of verify's checks across nodes (imgbuild.verify.nodechecks) that run its programs or judge
                 its pin: such a check runs where the image has the block (or one that provides it) and, without
                 one, skips naming them (`imgbuild.blocks.feeding`);
    under_os_packages  its runtime fragment goes under the runtime stage's OS-package layer, after a layer of its own
                 packages (Contribution.runtime_packages): for the big layers that need nothing but Python (the venv,
                 PyTorch's wheels), so that a change to the OS packages or to any other block leaves them cached;
    template_globals  the helpers its template calls, by name.

    Its Dockerfile fragments are the macros `builder`, `runtime` and `final` of `<name>.j2` next to its module (`final`:
    stages of their own after the runtime stage, the last of which is the image); its verify checks are registered
    with `imgbuild.checks.check(..., "<name>")` in its module.
    """

    name: ClassVar[str]
    options: ClassVar[type[Strict]]
    modes: ClassVar[Mapping[str, Provides]]
    details: ClassVar[type[Details]] = Details
    provides: ClassVar[tuple[str, ...]] = ()
    after: ClassVar[tuple[str, ...]] = ()
    build_after: ClassVar[tuple[str, ...]] = ()
    tag: ClassVar[tuple[int, str] | None] = None
    top_level: ClassVar[bool] = False
    node_checks: ClassVar[tuple[str, ...]] = ()
    under_os_packages: ClassVar[bool] = False
    template_globals: ClassVar[Mapping[str, Callable[..., Any]]] = {}

    @abstractmethod
    def resolve(self, options: Any, rs: Resolution) -> Pin:
        """Its pin rule: its options + the resolution state -> its Pin (the compatibility checks it owns included)."""

    def contribute(self, pin: Pin, ctx: Context) -> Contribution:
        """Packages, PATH / LD_LIBRARY_PATH, environment, manifest extras of a pin (default: none)."""
        return Contribution(name=self.name)

    @property
    def template(self) -> str:
        return f"blocks/{self.name}/{self.name}.j2"

    def contribution(self, pin: Pin, ctx: Context) -> Contribution:
        """The block's contribution, under its name."""
        c = self.contribute(pin, ctx)
        c.name = self.name
        return c

    def __repr__(self) -> str:
        return f"<block {self.name}>"


class Downloads(ABC):
    """It downloads files in its fragments: `imgbuild lock` records a sha256 for each URL (imgbuild.pin.content), and
    its template downloads them through `_build.j2`'s `download` with `ctx.content.download(url)`, which checks it."""

    @abstractmethod
    def downloads(self, pin: Pin, ctx: Context) -> list[str]:
        """The URLs its fragments download, from its pin and the context."""


class PythonSets(ABC):
    """It installs Python requirement sets, in install order: set name (`<block>` or `<block>/<layer>`) ->
    requirement specifiers (`torch==2.9.1`; `--no-binary=NAME`: NAME installs from its sdist, built with
    --no-build-isolation, its build requirements being an earlier set). `imgbuild lock` resolves each set's closure
    with hashes (pin.wheels: a later set holds what the earlier ones do not) and its template installs a set with
    `pip_install(pip, ctx, name)` (--require-hashes --no-deps).

    requirements_stage  the stage its template installs its sets in: every builder-stage set installs before any
                 runtime-stage one (the runtime copies the builder's venv first), whatever the registry's order;
    requirements_apart  its sets installed apart from the venv (pip --target: the CUDA toolkit's wheels, builder
                 only): each is resolved before the venv's sets, holds its whole closure, and its versions constrain
                 theirs (one image, one version of each) without taking them out of the venv.
    """

    requirements_stage: ClassVar[Literal["builder", "runtime"]] = "builder"
    requirements_apart: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def requirements(self, pin: Pin, ctx: Context) -> Mapping[str, list[str]]:
        """Its requirement sets for this pin (empty: none this time)."""


class PythonDists(ABC):
    """Its pin puts Python distributions in the image outside pip (a distribution's python3-mpi4py, a base image's
    torch): requirement sets are resolved with them as constraints and never install them again (pin.wheels), so a
    later set cannot replace them unseen."""

    @abstractmethod
    def python_dists(self, pin: Pin) -> Mapping[str, str]:
        """name -> version of what the pin installs outside pip."""


class ImageFacts(Protocol):
    """What a block's data files read of the image's manifest (imgbuild.image.manifest.Manifest, on the floor
    above, is one)."""

    @property
    def recipe(self) -> str: ...
    @property
    def python(self) -> str: ...
    @property
    def slots(self) -> int: ...
    @property
    def ssh_ports(self) -> tuple[int, ...]: ...
    @property
    def platform(self) -> Any: ...

    def details(self, name: str) -> Details | None: ...


class LaunchLines(Protocol):
    """The launch lines made from the manifest (imgbuild.image.launch.Launch, on the floor above, is one)."""

    @property
    def mpirun(self) -> tuple[str, ...]: ...
    @property
    def env_defaults(self) -> tuple[tuple[str, str], ...]: ...

    def torchrun_template(self) -> list[str]: ...


class ShipsFiles(ABC):
    """It COPYs files of its own into the image.

    files  (context path, source, mode): a source `*.j2` is a template (rendered with the recipe, the context, the
           pins and every block's options by name), any other a static file under imgbuild/blocks/ (its scripts:
           <name>/files/), copied as it is.
    """

    files: ClassVar[tuple[tuple[str, str, int], ...]] = ()

    @abstractmethod
    def data(self, pin: Pin, manifest: ImageFacts, launch: LaunchLines) -> Mapping[str, str]:
        """The data files its scripts read (context path -> text), made from its pin, the image's manifest and its
        launch lines: KEY=VALUE or one-argument-per-line text, never shell code."""


class UserCode(ABC):
    """It COPYs files from the user's own tree (the `app` block's code): the image holds more than the lock says."""

    @abstractmethod
    def context(self, pin: Pin, ctx: Context) -> list[tuple[str, bytes, int]]:
        """(context path, bytes, mode) of the files its fragments COPY."""

    @abstractmethod
    def image_digest(self, pin: Pin, resolved: Any) -> str | None:
        """What the image holds of it beyond the lock, as a digest the image's tags fold in (None: nothing)."""

    @abstractmethod
    def manifest_entry(self, pin: Pin, resolved: Any, image_digest: str | None) -> Any:
        """Its entry in the image's manifest (a field of Manifest named after the block; None: none), given that
        digest (render reads it once per plan)."""


class RecipeRules:
    """It has a rule about the rest of the recipe (a block overrides the one it has)."""

    def required(self, recipe: Any) -> str | None:
        """Why a recipe without the block is wrong (None when it may be left out)."""
        return None

    def recipe_rule(self, recipe: Any) -> tuple[tuple[str, ...], str] | None:
        """A rule its options keep with the rest of the recipe (sshd: not the host's port 22 under the host's
        network): None, or the key it breaks (a path in the recipe) and why; recipe.load refuses such a recipe (a
        RecipeError naming the file and line that set the key), whatever command reads it."""
        return None


class Released(ABC):
    """It has release rows (blocks/<name>/releases.yaml, read once): each release's date, sha256, what it bundles or
    was tested with, where that was read, and which releases and combinations with other components are known bad
    (the resolver refuses or warns: `imgbuild.blocks.known_bad`).

    artifact  how `imgbuild lock` reads what its publisher's own archive says of a release (None: it reads nothing).
    """

    artifact: ClassVar[Artifact | None] = None

    @abstractmethod
    def release_file(self) -> ReleaseFile:
        """Its release file, read once."""


class Tracks(ABC):
    """It tells `imgbuild outdated` where to look for its newer releases (without it: by its pin's source: the
    distribution's table, the block it comes with, the base image, or its release file's rows for a release or
    installer download)."""

    @abstractmethod
    def track(self, pin: Pin, resolved: Any, release_file: Callable[[str], Any]) -> list[Tracked] | None:
        """From its pin, the resolved recipe and any block's release file by name (None: by its pin's source)."""
