"""A SageMaker job's code as the SDK ships it, for the tests of fetch-code: an S3 server (moto's, in server mode, a
real HTTP endpoint on the given address), sourcedir.tar.gz archives (good ones and hostile ones), and a pure-Python
wheel made with zipfile, so a requirements.txt installs offline (`--no-index --find-links`).

Used by tests/test_fetch_code.py (fetch-code run here), tests/test_sagemaker.py (the cpu image's `train`) and
tests/test_sagemaker_sdk.py (SDK 2.x local mode uploading source_dir to S3).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import os
import socket
import tarfile
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Dummy credentials: moto accepts any; they never reach AWS.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "AKIAIMGBUILDTEST0000", "AWS_SECRET_ACCESS_KEY": "imgbuild-test-not-a-secret"}
REGION = "us-east-1"

# The requirement the code's requirements.txt names: a wheel shipped inside the code itself (wheels/).
DEP_NAME, DEP_VERSION, DEP_MODULE = "imgbuild-probe-dep", "1.0", "imgbuild_probe_dep"
BAD_REQUIREMENTS = "--no-index\nimgbuild-no-such-dist==9\n"  # pip fails: no such distribution
REQUIREMENTS = f"--no-index\n--find-links wheels\n{DEP_NAME}=={DEP_VERSION}\n"


@dataclass
class S3:
    """A running S3 endpoint and a client of it."""

    endpoint: str  # http://ADDRESS:PORT
    client: Any

    def bucket(self) -> str:
        name = f"imgbuild-test-{uuid.uuid4().hex[:12]}"
        self.client.create_bucket(Bucket=name)
        return name

    def put(self, bucket: str, key: str, data: bytes) -> str:
        self.client.put_object(Bucket=bucket, Key=key, Body=data)
        return f"s3://{bucket}/{key}"

    def env(self) -> dict[str, str]:
        """What a container (or fetch-code run here) needs to reach it, as SDK 2.x local mode sets it."""
        return {"AWS_ENDPOINT_URL_S3": self.endpoint, "AWS_DEFAULT_REGION": REGION, **CREDENTIALS}


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def s3_server(address: str) -> Iterator[S3]:
    """moto's S3 in server mode on `address` (a free port), reachable without any proxy."""
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port(address)
    server = ThreadedMotoServer(ip_address=address, port=port, verbose=False)
    server.start()
    no_proxy = ",".join(filter(None, [os.environ.get("NO_PROXY", ""), address]))
    saved = {k: os.environ.get(k) for k in ("NO_PROXY", "no_proxy")}
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = no_proxy
    try:
        endpoint = f"http://{address}:{port}"
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name=REGION,
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )
        yield S3(endpoint, client)
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def wheel() -> tuple[str, bytes]:
    """(file name, bytes) of a pure-Python wheel of DEP_NAME: its module holds VALUE = 42."""
    dist = DEP_NAME.replace("-", "_")
    dist_info = f"{dist}-{DEP_VERSION}.dist-info"
    files = {
        f"{DEP_MODULE}/__init__.py": b"VALUE = 42\n",
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {DEP_NAME}\nVersion: {DEP_VERSION}\n".encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return f"{dist}-{DEP_VERSION}-py3-none-any.whl", out.getvalue()


def sourcedir(files: dict[str, str | bytes], *, with_dep: bool = False) -> bytes:
    """A sourcedir.tar.gz as the SDK makes it (members relative to source_dir); `with_dep`: plus requirements.txt
    and the wheel it names, in wheels/."""
    members: dict[str, str | bytes] = dict(files)
    if with_dep:
        name, data = wheel()
        members[f"wheels/{name}"] = data
        members["requirements.txt"] = REQUIREMENTS
    return tar_gz([(name, data if isinstance(data, bytes) else data.encode()) for name, data in members.items()])


def tar_gz(entries: list[tuple[str, bytes] | tarfile.TarInfo]) -> bytes:
    """A tar.gz of regular files (name, data) and of any member (a TarInfo: links, fifos, odd names)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for entry in entries:
            if isinstance(entry, tarfile.TarInfo):
                tar.addfile(entry)
                continue
            name, data = entry
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def member(name: str, kind: bytes, linkname: str = "") -> tarfile.TarInfo:
    """A special tar member: tarfile.SYMTYPE, LNKTYPE, FIFOTYPE, CHRTYPE..."""
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, 0o644
    return info


# Archives fetch-code must refuse (name -> (entries, the member its reason names)).
HOSTILE: dict[str, tuple[list[tuple[str, bytes] | tarfile.TarInfo], str]] = {
    "dotdot": ([("train.py", b""), ("../escaped.py", b"print('out')\n")], "../escaped.py"),
    "absolute": ([("/tmp/imgbuild-absolute.py", b"")], "/tmp/imgbuild-absolute.py"),
    "symlink-out": ([member("etc", tarfile.SYMTYPE, "../../../etc")], "etc"),
    "symlink-absolute": ([member("passwd", tarfile.SYMTYPE, "/etc/passwd")], "passwd"),
    "hardlink-out": ([member("shadow", tarfile.LNKTYPE, "../../etc/shadow")], "shadow"),
    "fifo": ([member("pipe", tarfile.FIFOTYPE)], "pipe"),
    "device": ([member("null", tarfile.CHRTYPE)], "null"),
}


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path
