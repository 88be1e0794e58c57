"""Where a recipe comes from (render.Provenance): the repository's URL and the commit that last changed the recipe,
the recipes it extends and its lock. This is the one edge of the image floor that reads the world (git), called by
the commands that render (`build`, `render`), never by `render.plan`.

The revision is the last commit that touched those files (those in the recipe's own repository), not HEAD: an
unrelated commit leaves the image's labels (so its id) as they were, and a tag pushed to an immutable repository is
not refused for a new revision that changed nothing of it. Files with uncommitted changes, or not in git, have no
revision: the label is left out, honestly.

The source is the URL of the remote the recipe's repository names (`origin`, else its only remote), without any
credentials it may carry; else the URL imgbuild's own package metadata names (Project-URL Source / Repository), for
the shipped recipes of an installed wheel; else none.
"""

from __future__ import annotations

import re
import subprocess
from importlib import metadata
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from imgbuild.image.render import Provenance
from imgbuild.recipe import LoadedRecipe

GIT_TIMEOUT_S = 10.0
_SCP_LIKE = re.compile(r"^(?:[^@/]+@)?(?P<host>[A-Za-z0-9.-]+):(?P<path>(?!/)[^\s]+)\Z")  # git@github.com:org/repo.git
_PROJECT_URL_NAMES = ("source", "repository", "source code", "code")


def of(loaded: LoadedRecipe) -> Provenance:
    """The provenance of a loaded recipe (its lock beside it counts as one of its files)."""
    files = [*loaded.chain, loaded.path.with_name(f"{loaded.path.stem}.lock.json")]
    folder = loaded.path.resolve().parent
    revision = _revision(folder, [f for f in files if f.exists()])
    source = _remote_url(folder) if revision is not None else None
    return Provenance(source=source or project_url(), revision=revision)


def _git(folder: Path, *args: str) -> str | None:
    """git's stdout (stripped), None when git is missing, fails or takes too long."""
    try:
        proc = subprocess.run(
            ["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def _revision(folder: Path, files: list[Path]) -> str | None:
    top = _git(folder, "rev-parse", "--show-toplevel")
    if not top:
        return None
    root = Path(top).resolve()
    # The files of the recipe's own repository: a parent from elsewhere (a shipped recipe a user's recipe extends)
    # belongs to another repository's history.
    paths = [str(f.resolve()) for f in files if f.resolve().is_relative_to(root)]
    if not paths:
        return None
    # Untracked or changed files (staged or not): what is built is not what any commit holds.
    if _git(folder, "status", "--porcelain", "--untracked-files=all", "--", *paths) != "":
        return None
    tracked = _git(folder, "ls-files", "--error-unmatch", "--", *paths)
    if not tracked:
        return None
    commit = _git(folder, "log", "-1", "--format=%H", "--", *paths)
    return commit if commit and re.fullmatch(r"[0-9a-f]{40}([0-9a-f]{24})?", commit) else None


def _remote_url(folder: Path) -> str | None:
    remotes = (_git(folder, "remote") or "").split()
    name = "origin" if "origin" in remotes else remotes[0] if len(remotes) == 1 else None
    if name is None:
        return None
    return public_url(_git(folder, "remote", "get-url", "--", name) or "")  # a remote may be named `-x`


def public_url(url: str) -> str | None:
    """A remote's URL as a browsable https:// (or http://) URL without credentials; None for a local path or
    anything else that names no public place. `git@github.com:org/repo.git` -> `https://github.com/org/repo`."""
    url = url.strip()
    m = _SCP_LIKE.match(url)
    if m and "://" not in url:
        host, path = m.group("host"), m.group("path")
    else:
        parts = urlsplit(url)
        if parts.scheme not in ("https", "http", "ssh", "git", "git+ssh") or not parts.hostname:
            return None
        host, path = parts.hostname, parts.path.lstrip("/")
        if parts.port and parts.scheme in ("https", "http"):
            host = f"{host}:{parts.port}"
        if parts.scheme == "http":
            return urlunsplit(("http", host, "/" + path.removesuffix(".git"), "", "")) if path else None
    path = path.removesuffix(".git").strip("/")
    return urlunsplit(("https", host, "/" + path, "", "")) if path else None


def project_url() -> str | None:
    """The repository URL imgbuild's package metadata names (pyproject's [project.urls] Source or Repository)."""
    try:
        entries = metadata.metadata("imgbuild").get_all("Project-URL") or []
    except metadata.PackageNotFoundError:
        return None
    for entry in entries:
        label, _, url = str(entry).partition(",")
        if label.strip().lower() in _PROJECT_URL_NAMES and url.strip():
            return public_url(url.strip()) or None
    return None
