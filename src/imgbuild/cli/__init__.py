"""The `imgbuild` command line. Every ImgbuildError becomes a short message and its own exit code; a traceback
only with IMGBUILD_DEBUG=1.

root.py: the typer app, its callback and `main` (the console entry point, `imgbuild = "imgbuild.cli:main"`).
One module per group of commands (`recipes`, `build`, `verify`, `run`, `publish`), each with a `register(app)`
that adds its commands; `imgbuild cluster` is `cluster`'s own sub-app.
Start-up is kept short: a command imports what it needs when it runs (pydantic, docker, requests, boto3, testinfra
and rich are imported by the commands that use them), so `imgbuild --version` imports typer and nothing else of
weight. `benchmarks/startup_bench.py` measures it.
"""

from imgbuild.cli.root import app, main

__all__ = ["app", "main"]
