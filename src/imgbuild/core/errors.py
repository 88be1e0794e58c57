"""Every failure imgbuild reports to a user, each class with its own exit code.

`cli.main()` catches `ImgbuildError` once and prints its message; a traceback is shown only with
IMGBUILD_DEBUG=1. Exit code 1 is left for unexpected errors and 2 for command-line usage (click's own).
"""

from __future__ import annotations

from imgbuild.core.validate import redact


class ImgbuildError(Exception):
    """Base class: a message meant for the user and an exit code."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        # A URL, a reference or an engine address quoted in a message may hold a password: every error says
        # `user:***@host` instead, wherever it is shown (the CLI's error line, a table row, --json).
        message = redact(message)
        super().__init__(message)
        self.message = message
        self.hint = None if hint is None else redact(hint)

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\nhint: {self.hint}"


class UsageError(ImgbuildError):
    """What the user typed or set is not something imgbuild can use: a malformed argument found past click's own
    checks, or an environment variable naming a folder that cannot be used (IMGBUILD_STATE_DIR). Exit 2, as click's
    usage errors."""

    exit_code = 2


class RecipeError(ImgbuildError):
    """A recipe file is missing, unreadable, or does not match the schema."""

    exit_code = 3


class LockError(ImgbuildError):
    """A lock file is missing, unreadable, or stale against its recipe."""

    exit_code = 4


class ResolveError(ImgbuildError):
    """The components of a recipe cannot be pinned, or their versions do not fit together."""

    exit_code = 5


class RenderError(ImgbuildError):
    """A template failed to render."""

    exit_code = 6


class IndexLookupError(ImgbuildError):
    """The package index could not answer a lookup (network, missing release, malformed wheel)."""

    exit_code = 7


class EngineError(ImgbuildError):
    """The Docker engine cannot be reached or refused a request."""

    exit_code = 8


class BuildError(ImgbuildError):
    """An image build failed."""

    exit_code = 9


class BaseImageMissing(BuildError):
    """The base image is neither present in the engine nor pullable."""

    exit_code = 10


class VerifyError(ImgbuildError):
    """Verification of an image found failures, or could not run."""

    exit_code = 11


class PushError(ImgbuildError):
    """Publishing to a registry failed."""

    exit_code = 12


class DoctorError(ImgbuildError):
    """`imgbuild doctor` found something a recipe needs missing."""

    exit_code = 13


class OutputError(ImgbuildError):
    """A file the user asked for (a report's JSON, JUnit or plot) could not be written; names the path. Not 11: that
    code means the thing checked failed, and a full disk or a missing folder says nothing about it."""

    exit_code = 14


class DriftError(ImgbuildError):
    """`imgbuild lock --check`: the world no longer serves what the lock records (a moved tag, a re-uploaded
    tarball, a wheel with another hash), or the lock no longer follows from its recipe."""

    exit_code = 15


class ContentError(ImgbuildError):
    """What a build would use does not match the lock: a `--sources` folder missing a file or holding one whose
    sha256 differs, a base image whose id differs from the one fetched."""

    exit_code = 16


class ScanGateError(ImgbuildError):
    """`push --scan-gate`: the registry's vulnerability scan of the pushed image found findings at or above the gate's
    level that are not allowed, or gave no verdict (the scan failed, the image is unsupported, the scan did not finish
    in time). Not 12: the push itself worked, and what was pushed is not promoted."""

    exit_code = 17


class OutdatedError(ImgbuildError):
    """`imgbuild outdated`: a component's source (the package index, or a shipped table) offers a newer release than
    the recipe pins, whether or not it fits the other pins (as `npm outdated` exits 1). Its own code, not 1 (an
    unexpected error) and not 15 (the lock still matches what resolves today): a script tells "behind" from "broken"."""

    exit_code = 18


class Interrupted(ImgbuildError):
    """The user pressed Ctrl-C; what was started has been cleaned up."""

    exit_code = 130


class Terminated(Interrupted):
    """SIGTERM stopped the command (`timeout`, `docker stop`, a cancelled CI job); cleaned up as after Ctrl-C."""

    exit_code = 143  # 128 + SIGTERM, what a shell reports for a process SIGTERM ended
