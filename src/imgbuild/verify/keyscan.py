"""The image's own filesystem scanned for keys: ssh host keys, id_* private keys and credential-shaped text, in a
container whose entrypoint did not run (`ImageScan`, in the background while the checks run); the `no-keys-in-image`
check reads its outcome."""

from __future__ import annotations

import threading
import time

from imgbuild.checks.context import ImageScan as ScanOutcome
from imgbuild.engine.containers import Containers

SCAN_TIMEOUT_S = 600

# Credential-shaped text, as secret scanners (AWS's deep-learning-containers sanity scan among them) look for it in a
# file's content: a PEM private-key header anywhere in a line (inside a JSON string too), an AWS access key ID, an AWS
# secret access key given a value. One extended regular expression (grep -E).
TOKEN_PATTERN = "|".join(
    (
        r"-----BEGIN ([A-Z0-9]+ )*PRIVATE KEY-----",
        r"(^|[^0-9A-Z])(AKIA|ASIA)[0-9A-Z]{16}([^0-9A-Z]|$)",
        r"aws_secret_access_key.{0,4}[:=].{0,4}[A-Za-z0-9/+]{40}",
    )
)
# Runs in a container whose entrypoint did NOT run (so the host keys it would make are not there): key files by name,
# and TOKEN_PATTERN in any text file under 1 MiB, on the image's own filesystem (-xdev: not /proc, /sys, /dev). Its
# one argument, the folder to scan, is / in the image (tests give their own).
SCAN_SCRIPT = (
    r"""
root="${1:-/}"
find "$root" -xdev \( -name 'ssh_host_*' -o -name id_rsa -o -name id_dsa -o -name id_ecdsa -o -name id_ed25519 \
    -o -name id_ecdsa_sk -o -name id_ed25519_sk \) -print 2>/dev/null | sed 's/^/NAME /'
find "$root" -xdev -type f -size -1024k -exec grep -lIE -- '"""
    + TOKEN_PATTERN.replace("'", "'\\''")
    + r"""' {} + 2>/dev/null | sed 's/^/TOKEN /'
echo IMGBUILD-SCAN-DONE
"""
)


def scan_findings(out: str) -> set[str]:
    """The files SCAN_SCRIPT's output names (a NAME or TOKEN line each)."""
    return {line.split(" ", 1)[1] for line in out.splitlines() if line.startswith(("NAME ", "TOKEN "))}


class ImageScan(threading.Thread):
    """Scans the image's own filesystem for keys in a container with the entrypoint overridden (in background)."""

    def __init__(self, containers: Containers, image: str) -> None:
        super().__init__(name="imgbuild-verify-scan", daemon=True)
        self.containers, self.image = containers, image
        self.outcome = ScanOutcome(error="the scan did not finish")
        self.duration_s = 0.0

    def run(self) -> None:
        start = time.monotonic()
        try:
            _, out = self.containers.run_to_end(
                self.image, ["-c", SCAN_SCRIPT], "scan", timeout_s=SCAN_TIMEOUT_S, entrypoint=["/bin/sh"],
                network_disabled=True,
            )  # fmt: skip
            if "IMGBUILD-SCAN-DONE" not in out:
                self.outcome = ScanOutcome(error=f"the scan did not complete: {out[-300:]}")
            else:
                files = sorted(scan_findings(out))
                self.outcome = ScanOutcome(files=tuple(files))
        except Exception as exc:  # reported as the check's failure, never lost in a thread
            self.outcome = ScanOutcome(error=f"{type(exc).__name__}: {exc}")
        finally:
            self.duration_s = round(time.monotonic() - start, 3)

    def result(self) -> ScanOutcome:
        self.join()
        return self.outcome
