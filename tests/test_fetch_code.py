"""fetch-code (the sagemaker block's static script that train runs on every host) run here, with this Python, on
real archives and a real S3 endpoint (moto's server on 127.0.0.1): where the code comes from, safe unpacking, the
failure reasons and their exit statuses. The same script in the cpu image: tests/test_sagemaker.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from imgbuild.blocks import TEMPLATE_DIR
from sm_code import BAD_REQUIREMENTS, HOSTILE, S3, member, s3_server, sourcedir, tar_gz, write

FETCH_CODE = TEMPLATE_DIR / "sagemaker" / "files" / "fetch-code"
# The exit statuses of its header.
BAD_VALUE, NO_PATH, NO_KEY, NO_BUCKET, DENIED, S3_ERROR, NO_BOTO3, NOT_TAR, UNSAFE, CANNOT_WRITE, PIP = range(80, 91)


@dataclass
class Fetched:
    status: int
    reason: str  # what train makes the failure reason
    log: str


@dataclass
class Host:
    """One host's /opt/ml, in tmp."""

    root: Path

    @property
    def code(self) -> Path:
        return self.root / "code"

    @property
    def channel(self) -> Path:
        return self.root / "input" / "data" / "code"

    def hyperparameters(self, **values: str) -> None:
        """Written as the SDK writes them: each value JSON-encoded."""
        path = self.root / "input" / "config" / "hyperparameters.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({k: json.dumps(v) for k, v in values.items()}))

    def fetch(self, *python_options: str, env: dict[str, str] | None = None) -> Fetched:
        reason = self.root / "reason"
        environ = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SAGEMAKER_"))}
        ran = subprocess.run(
            [sys.executable, *python_options, str(FETCH_CODE), "--code-dir", str(self.code),
             "--hyperparameters", str(self.root / "input" / "config" / "hyperparameters.json"),
             "--channel", str(self.channel), "--reason-file", str(reason)],
            capture_output=True, text=True, env={**environ, **(env or {})}, timeout=120, check=False,
        )  # fmt: skip
        return Fetched(ran.returncode, reason.read_text() if reason.exists() else "", ran.stderr)

    def files(self) -> dict[str, str]:
        if not self.code.exists():
            return {}
        return {str(p.relative_to(self.code)): p.read_text() for p in self.code.rglob("*") if p.is_file()}


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path / "opt-ml")


@pytest.fixture(scope="module")
def s3() -> Iterator[S3]:
    with s3_server("127.0.0.1") as served:
        yield served


CODE = {"train.py": "print('hi')\n", "lib/util.py": "X = 1\n"}


def test_nothing_to_fetch_leaves_baked_code_alone(host: Host) -> None:
    write(host.code / "train.py", b"baked\n")
    write(host.code / "requirements.txt", b"--no-index\nnot-installed-at-start\n")  # baked: not installed again
    done = host.fetch()
    assert (done.status, host.files()["train.py"]) == (0, "baked\n"), done.log


def test_local_archive_and_folders(host: Host, tmp_path: Path) -> None:
    archive = write(tmp_path / "src" / "sourcedir.tar.gz", sourcedir(CODE))
    host.hyperparameters(sagemaker_submit_directory=f"file://{archive}", sagemaker_program="train.py")
    done = host.fetch()
    assert (done.status, host.files()) == (0, CODE), done.log
    # A folder other than the code folder is copied; the code folder itself (local mode's mount) is left alone.
    other = tmp_path / "other"
    write(other / "other.py", b"y = 2\n")
    assert host.fetch(env={"SAGEMAKER_SUBMIT_DIRECTORY": str(other)}).status == 0  # the environment wins
    assert host.files() == {**CODE, "other.py": "y = 2\n"}
    done = host.fetch(env={"SAGEMAKER_SUBMIT_DIRECTORY": str(host.code)})
    assert done.status == 0 and "nothing to fetch" in done.log, done.log


@pytest.mark.parametrize(
    ("value", "status", "reason"),
    [
        ("/nowhere/sourcedir.tar.gz", NO_PATH, "sagemaker_submit_directory /nowhere/sourcedir.tar.gz: no such file"),
        ("code/here", BAD_VALUE, "expected s3://BUCKET/KEY, file://PATH or an absolute path"),
        ("s3://only-a-bucket", BAD_VALUE, "expected s3://BUCKET/KEY of a tar.gz"),
    ],
    ids=["missing-path", "relative", "no-key"],
)
def test_unusable_submit_directories(host: Host, value: str, status: int, reason: str) -> None:
    host.hyperparameters(sagemaker_submit_directory=value)
    done = host.fetch()
    assert done.status == status and reason in done.reason, done.log


def test_code_channel_archive_or_files(host: Host) -> None:
    write(host.channel / "sourcedir.tar.gz", sourcedir(CODE))
    assert host.fetch().status == 0
    assert host.files() == CODE
    (host.channel / "sourcedir.tar.gz").unlink()
    write(host.channel / "plain.py", b"z = 3\n")
    assert host.fetch().status == 0
    assert host.files() == {**CODE, "plain.py": "z = 3\n"}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_archives_are_refused_whole(host: Host, tmp_path: Path, name: str) -> None:
    entries, bad = HOSTILE[name]
    archive = write(tmp_path / f"{name}.tar.gz", tar_gz([("first.py", b"1\n"), *entries]))
    host.hyperparameters(sagemaker_submit_directory=str(archive))
    done = host.fetch()
    assert done.status == UNSAFE, done.log
    assert done.reason.startswith(f"sagemaker_submit_directory {archive}: unsafe archive member '{bad}': "), done
    assert host.files() == {}  # nothing unpacked, not even the safe member before it
    assert not (tmp_path / "opt-ml" / "escaped.py").exists()


def test_links_inside_the_code_folder_are_kept(host: Host, tmp_path: Path) -> None:
    archive = write(tmp_path / "links.tar.gz", tar_gz([
        ("lib/util.py", b"X = 1\n"),
        member("util.py", tarfile.SYMTYPE, "lib/util.py"),
        member("lib/again.py", tarfile.LNKTYPE, "lib/util.py"),
    ]))  # fmt: skip
    host.hyperparameters(sagemaker_submit_directory=str(archive))
    done = host.fetch()
    assert done.status == 0, done.log
    assert (host.code / "util.py").is_symlink() and host.files()["lib/again.py"] == "X = 1\n"


def test_not_a_gzip_tar(host: Host, tmp_path: Path) -> None:
    archive = write(tmp_path / "sourcedir.tar.gz", b"PK\x03\x04 a zip, not a tar.gz")
    host.hyperparameters(sagemaker_submit_directory=str(archive))
    done = host.fetch()
    assert done.status == NOT_TAR and "not a gzip-compressed tar archive" in done.reason, done.log


def test_code_from_s3(host: Host, s3: S3) -> None:
    bucket = s3.bucket()
    uri = s3.put(bucket, "job-1/source/sourcedir.tar.gz", sourcedir(CODE))
    host.hyperparameters(sagemaker_submit_directory=uri)
    done = host.fetch(env=s3.env())
    assert (done.status, host.files()) == (0, CODE), done.log
    # S3_ENDPOINT_URL is honoured too (passed to boto3 as its endpoint_url).
    env = {**s3.env(), "S3_ENDPOINT_URL": s3.endpoint, "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9"}
    assert host.fetch(env=env).status == 0


@pytest.mark.parametrize(
    ("where", "status", "reason"),
    [
        ("missing-key", NO_KEY, "{uri}: no such object (NoSuchKey)"),
        ("missing-bucket", NO_BUCKET, "{uri}: no such bucket (NoSuchBucket)"),
        ("unreachable", S3_ERROR, "{uri}: cannot download it: "),
    ],
    ids=["missing-key", "missing-bucket", "unreachable"],
)
def test_s3_failures_say_why(host: Host, s3: S3, where: str, status: int, reason: str) -> None:
    bucket = s3.bucket()
    uri = f"s3://{bucket}{'-gone' if where == 'missing-bucket' else ''}/nothing/here.tar.gz"
    host.hyperparameters(sagemaker_submit_directory=uri)
    env = {**s3.env(), **({"AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1"}
                          if where == "unreachable" else {})}  # fmt: skip
    done = host.fetch(env=env)
    assert done.status == status, done.log
    assert done.reason.startswith("sagemaker_submit_directory " + reason.format(uri=uri)), done.reason


def test_no_boto3(host: Host) -> None:
    host.hyperparameters(sagemaker_submit_directory="s3://bucket/job/source/sourcedir.tar.gz")
    done = host.fetch("-S")  # no site-packages: an image without boto3
    assert done.status == NO_BOTO3, done.log
    assert "this image has no boto3 to download it with" in done.reason


def test_failing_requirements_name_pips_error(host: Host, tmp_path: Path) -> None:
    archive = write(tmp_path / "sourcedir.tar.gz", sourcedir({**CODE, "requirements.txt": BAD_REQUIREMENTS}))
    host.hyperparameters(sagemaker_submit_directory=str(archive))
    done = host.fetch()
    assert done.status == PIP, done.log
    assert done.reason.startswith("pip install -r requirements.txt failed (exit 1): ERROR: "), done.reason
    assert "imgbuild-no-such-dist" in done.reason and "\n" not in done.reason.strip()
