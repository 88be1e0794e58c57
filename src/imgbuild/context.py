"""Build contexts: a folder holding the Dockerfile and only the files it copies."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from imgbuild.errors import ImgbuildError
from imgbuild.render import CA_DIR, BuildPlan


def write(plan: BuildPlan, folder: Path, *, ca_bundle: Path | None = None) -> list[Path]:
    """Write the Dockerfile and the plan's files (with their modes) into `folder`; returns what was written.

    `ca_bundle` (PEM) is added as imgbuild/ca/imgbuild-extra.crt, which the builder stages trust.
    """
    folder.mkdir(parents=True, exist_ok=True)
    written = [folder / "Dockerfile"]
    (folder / "Dockerfile").write_text(plan.dockerfile)
    for f in plan.files:
        target = folder / f.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(f.content)
        os.chmod(target, f.mode)
        written.append(target)
    if ca_bundle is not None:
        try:
            text = ca_bundle.read_text()
        except OSError as exc:
            raise ImgbuildError(f"--ca-bundle {ca_bundle}: cannot read: {exc.strerror}") from None
        if "-----BEGIN CERTIFICATE-----" not in text:
            raise ImgbuildError(f"--ca-bundle {ca_bundle}: not a PEM certificate bundle")
        target = folder / CA_DIR / "imgbuild-extra.crt"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ca_bundle, target)
        os.chmod(target, 0o644)
        written.append(target)
    return written
