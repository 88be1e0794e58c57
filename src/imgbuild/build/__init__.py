"""Building an image: `imgbuild build` and what it stands on.

- command.py: the command (`build`: lock -> plan -> a build context -> BuildKit) and the checks before it (the
  disk, the platform, the base images);
- builders/: BuildKit, one module a job (buildx or the docker CLI's own, the cache, the argv, the process, its
  output, tags put back, the run);
- dockercontext.py: the context folder and the CA secret; sources.py: `sources fetch`, `build --sources`;
- doctor.py: `imgbuild doctor`.
"""

from imgbuild.build.command import (
    BuildResult,
    build,
    ca_bundle_from,
    check_disk,
    check_platform,
    engine_bases,
    log_folder,
    parse_build_args,
)

__all__ = [
    "BuildResult",
    "build",
    "ca_bundle_from",
    "check_disk",
    "check_platform",
    "engine_bases",
    "log_folder",
    "parse_build_args",
]
