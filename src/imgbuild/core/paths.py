"""Where the shipped templates and recipes are: the repository's images/ and recipes/ when running from a
checkout (editable install), else the copies packaged in the wheel."""

from __future__ import annotations

import os
from pathlib import Path

# Paths inside the images. The scripts that run there (static files: blocks/<block>/files/) get
# them from the data files render writes (a block's `data`), never typed again in bash; tests and verify use these.
IMAGE_ETC = "/etc/imgbuild"  # render's data files in every image (the scripts' IMGBUILD_ETC default)
MANIFEST_PATH = f"{IMAGE_ETC}/manifest.json"  # in every image: what render wrote and verify reads
# Every Debian package of the runtime stage after its apt-get install (package, version, architecture, and the .deb's
# SHA256 in apt's lists for that exact version; empty when the lists hold no such version: it came with the base),
# tab-separated: `imgbuild sbom` gives the packages their hashes from it.
DPKG_SHA256 = f"{IMAGE_ETC}/dpkg-sha256.tsv"
ENTRYPOINT = "/usr/local/bin/imgbuild-entrypoint"  # the image's ENTRYPOINT: runs the hooks, then the command
ENTRYPOINT_D = f"{IMAGE_ETC}/entrypoint.d"  # the hooks blocks drop there (sourced in name order)

_PKG = Path(__file__).resolve().parent.parent
_REPO = _PKG.parent.parent


def _pick(env: str, repo_dir: str, packaged: str) -> Path:
    if os.environ.get(env):
        return Path(os.environ[env])
    in_repo = _REPO / repo_dir
    return in_repo if in_repo.is_dir() else _PKG / packaged


def recipes_dir() -> Path:
    """Shipped recipes (override with IMGBUILD_RECIPES_DIR)."""
    return _pick("IMGBUILD_RECIPES_DIR", "recipes", "_recipes")


def images_dir() -> Path:
    """Jinja2 templates (override with IMGBUILD_IMAGES_DIR)."""
    return _pick("IMGBUILD_IMAGES_DIR", "images", "_images")


def state_dir() -> Path:
    """Build logs and compiled templates of this user: IMGBUILD_STATE_DIR, else `imgbuild` in the XDG cache folder
    (XDG_CACHE_HOME when it is an absolute path, as the XDG base directory rules say; else ~/.cache), as pip and uv
    keep theirs."""
    if os.environ.get("IMGBUILD_STATE_DIR"):
        return Path(os.environ["IMGBUILD_STATE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache") / "imgbuild"


def state_dir_named() -> str:
    """Where state_dir() comes from, for a message: `IMGBUILD_STATE_DIR=PATH`, or the default and that it is unset."""
    value = os.environ.get("IMGBUILD_STATE_DIR")
    return f"IMGBUILD_STATE_DIR={value}" if value else f"the state folder {state_dir()} (IMGBUILD_STATE_DIR is unset)"


def display(path: Path) -> str:
    """A path as the user would type it: relative to the working directory when it is below it (a path that cannot
    be resolved, a link loop, as given)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError, RuntimeError):  # RuntimeError: Python < 3.13's "Symlink loop"
        return str(path)
