"""How an image is built: BuildKit, driven through a docker CLI. One module a job:

- `choice`: which builder (`select`: buildx, else the docker CLI's own BuildKit; `Builder` says why);
- `cacheplan`: the cache between machines (`cache_plan`: a registry cache, else the inline cache,
  `push_inline_cache`);
- `argv`: the docker CLI's command line and environment for one build (`command`, `cli_env`);
- `process`: the CLI as a process: its output line by line, cancelled with SIGINT, then killed (`CliProcess`);
- `stream`: BuildKit's plain progress stream read into vertices, told to a `BuildObserver`;
- `tags`: the tags a build moved, put back (`TagSnapshot`);
- `run`: the build itself (`build` -> `BuildOutcome`), using all of the above.

The names callers use are importable from here.
"""

from __future__ import annotations

from imgbuild.build.builders.argv import cli_env, command
from imgbuild.build.builders.cacheplan import Cache, cache_plan, cache_ref_problem, check_cache_ref, push_inline_cache
from imgbuild.build.builders.choice import (
    BUILDER_ENV,
    BUILDX_MIN_CLASSIC,
    CLI_ENV,
    Builder,
    NoBuilder,
    Skipped,
    select,
)
from imgbuild.build.builders.process import CANCEL_WAIT_S
from imgbuild.build.builders.run import BuildOutcome, StepRecord, build, image_platform
from imgbuild.build.builders.stream import BuildObserver

__all__ = [
    "BUILDER_ENV",
    "BUILDX_MIN_CLASSIC",
    "CANCEL_WAIT_S",
    "CLI_ENV",
    "BuildObserver",
    "BuildOutcome",
    "Builder",
    "Cache",
    "NoBuilder",
    "Skipped",
    "StepRecord",
    "build",
    "cache_plan",
    "cache_ref_problem",
    "check_cache_ref",
    "cli_env",
    "command",
    "image_platform",
    "push_inline_cache",
    "select",
]
