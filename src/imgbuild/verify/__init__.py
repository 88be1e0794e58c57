"""`imgbuild verify`: prove that an image (or a machine) holds what its recipe's lock says.

- target.py: what to verify, resolved (`Target`): RECIPE -> its content-addressed image and its lock's manifest;
  IMAGE -> the recipe its label `io.imgbuild.recipe` names (and that recipe's lock when it is a shipped one);
- command.py: the command (`verify`): one container of the image (or, with `--host`, a machine) and the checks of
  `imgbuild.checks` run in it through pytest-testinfra;
- keyscan.py: the image's own filesystem scanned for keys, in a container whose entrypoint did not run;
- report.py: `VerifyReport`, its JSON and JUnit XML;
- gpuchecks.py: the host driver, IMEX channels, the plugin NCCL loads;
- nodechecks.py, nodesession.py, nodeworkloads.py: the checks across nodes, shared with `cluster test`;
  multinode.py: `verify --nodes`, containers on a network.
"""

from imgbuild.engine.containers import LABEL as LABEL_VERIFY
from imgbuild.verify.command import (
    EMULATION_SLOWDOWN,
    READY_TIMEOUT_S,
    RunOptions,
    host_spec,
    image_manifest,
    run_options,
    runs_sleep,
    verify,
)
from imgbuild.verify.keyscan import SCAN_SCRIPT, SCAN_TIMEOUT_S, TOKEN_PATTERN, ImageScan, scan_findings
from imgbuild.verify.report import VerifyReport, junit_xml, report_json
from imgbuild.verify.target import (
    LABEL_RECIPE,
    Target,
    expected_manifest,
    looks_like_image,
    names_recipe,
    resolve_target,
    target_for_image,
    target_for_recipe,
)

__all__ = [
    "EMULATION_SLOWDOWN",
    "LABEL_RECIPE",
    "LABEL_VERIFY",
    "READY_TIMEOUT_S",
    "SCAN_SCRIPT",
    "SCAN_TIMEOUT_S",
    "TOKEN_PATTERN",
    "ImageScan",
    "RunOptions",
    "Target",
    "VerifyReport",
    "expected_manifest",
    "host_spec",
    "image_manifest",
    "junit_xml",
    "looks_like_image",
    "names_recipe",
    "report_json",
    "resolve_target",
    "run_options",
    "runs_sleep",
    "scan_findings",
    "target_for_image",
    "target_for_recipe",
    "verify",
]
