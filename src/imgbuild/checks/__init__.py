"""The checks `imgbuild verify` runs, each contributed by the component it verifies.

A check is a function of a `CheckContext` (context.py): the machine to look at (anything with testinfra's
`run(command) -> result with rc/stdout/stderr`: a container, this host, an ssh host, or a fake in tests), the
components expected there (from the recipe's lock, else from the image's manifest) and what the run passed in
(devices, GPUs). `REGISTRY` (registry.py) maps a component name to its checks (each component's module registers its
own with `@check`); only the checks of components the image holds run, plus those of always.py, registered under
"image" (the manifest, keys, environment) and "platform" (GPUs), which run everywhere. Checks that only make sense
for an image (sshd, SageMaker, keys...) have the "container" scope; `--host` runs the "host" scope against a machine
with no container at all. verdicts.py: what a check returns; results.py: `CheckResult` and JUnit XML.

This package does not import docker or testinfra: `imgbuild.verify` connects, this package only asks questions.
"""

from imgbuild.checks.always import (
    LEGACY_CA_DIR,
    SECRETS_DIR,
    ca_bundle_absent,
    devices_visible,
    first_executable,
    gpu_nvidia_smi,
    machine_matches,
    manifest_diffs,
    manifest_matches_lock,
    no_keys_in_image,
    recipe_env,
)
from imgbuild.checks.context import (
    BOTH,
    COMMAND_TIMEOUT_S,
    CONTAINER,
    CheckContext,
    CommandOutput,
    Host,
    ImageScan,
    PinView,
    Ran,
    Scope,
)
from imgbuild.checks.registry import ALWAYS, REGISTRY, Check, CheckFn, check, run_checks, selected
from imgbuild.checks.verdicts import compare, fail, ldd_missing, passed, skip

__all__ = [
    "ALWAYS",
    "BOTH",
    "COMMAND_TIMEOUT_S",
    "CONTAINER",
    "LEGACY_CA_DIR",
    "REGISTRY",
    "SECRETS_DIR",
    "Check",
    "CheckContext",
    "CheckFn",
    "CommandOutput",
    "Host",
    "ImageScan",
    "PinView",
    "Ran",
    "Scope",
    "ca_bundle_absent",
    "check",
    "compare",
    "devices_visible",
    "fail",
    "first_executable",
    "gpu_nvidia_smi",
    "ldd_missing",
    "machine_matches",
    "manifest_diffs",
    "manifest_matches_lock",
    "no_keys_in_image",
    "passed",
    "recipe_env",
    "run_checks",
    "selected",
    "skip",
]
