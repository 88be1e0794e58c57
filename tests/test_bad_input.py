"""Bad input through the real command line: exit 3, a message naming the file, the line and the key, never a
traceback, never text from the recipe that breaks a line, and nothing unsafe in what is rendered.

Every case runs `imgbuild render FILE` (or `lock FILE`) as a user would: the CLI's app in this process (typer's
runner, stdout and stderr apart), or `python -m imgbuild.cli` in a subprocess where the process is what a case
judges (an address-space limit).
"""

from __future__ import annotations

import io
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from imgbuild.cli import app
from imgbuild.core.errors import RenderError
from imgbuild.image import render

REPO = Path(__file__).resolve().parent.parent
GIB = 1 << 30


def cli(*args: str | Path, limit_bytes: int | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`imgbuild ARGS` run from the repository's folder: in this process, or with `limit_bytes` in a subprocess under
    that address-space limit (and `timeout`)."""
    argv = [str(a) for a in args]
    if limit_bytes is None:
        here = os.getcwd()
        os.chdir(REPO)
        try:
            result = CliRunner().invoke(app, argv)
        finally:
            os.chdir(here)
        return subprocess.CompletedProcess(argv, result.exit_code, result.stdout, result.stderr)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    return subprocess.run(
        [sys.executable, "-m", "imgbuild.cli", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        preexec_fn=limit,
    )


def refused(proc: subprocess.CompletedProcess[str], *expected: str) -> str:
    """Assert a clean refusal (exit 3, each expected text in the message, no traceback, nothing on stdout, and
    every line of stderr one of imgbuild's own: no line was started by a newline taken from a recipe)."""
    err = proc.stderr
    assert proc.returncode == 3, err
    assert "Traceback" not in err and "unexpected error" not in err, err
    assert proc.stdout == "", proc.stdout
    for line in err.splitlines():
        assert line.startswith(("imgbuild: error: ", "  ", "hint: ")), f"stray line {line!r} in:\n{err}"
    for text in expected:
        assert text in err, f"{text!r} not in:\n{err}"
    return err


def write(d: Path, name: str, text: str) -> Path:
    p = d / name
    p.write_text(text, encoding="utf-8")
    return p


# ---- 1. os.packages and every other free-form string that reaches a RUN line or a script


def test_package_with_a_newline_cannot_add_an_instruction(tmp_path: Path) -> None:
    p = write(tmp_path, "inj.yaml", 'extends: cpu\nos:\n  packages: ["iproute2\\nRUN touch /x"]\n')
    err = refused(cli("render", p), "inj.yaml:3: os.packages.0:", "Debian package name", r"'iproute2\nRUN touch /x'")
    assert "\nRUN touch" not in err


@pytest.mark.parametrize("package", ["iproute2=6.1.0-3", "libnccl2=2.21.5-1+cuda12.4", "g++", "libc6=1:2.36-9"])
def test_debian_package_names_and_versions_pass(tmp_path: Path, package: str) -> None:
    p = write(tmp_path, "ok.yaml", f"extends: cpu\nos:\n  packages: [{package!r}]\n")
    proc = cli("render", "--unlocked", p)  # the recipe's text is the point: no lock needed to look at it
    assert proc.returncode == 0, proc.stderr
    assert f"      {package} \\\n" in proc.stdout


# (recipe text after `extends: cpu`, what the message must name)
UNSAFE = {
    "package with a space": ("os:\n  packages: ['curl wget']\n", "os.packages.0"),
    "package with a shell": ("os:\n  packages: ['curl;id']\n", "os.packages.0"),
    "package version with a shell": ("os:\n  packages: ['curl=$(id)']\n", "os.packages.0"),
    "base image": ('base:\n  image: "debian\\nRUN id"\n', "base.image"),
    "base tag": ("base:\n  tag: 'bookworm;id'\n", "base.tag"),
    "os version": ("os:\n  version: '12 && id'\n", "os.version"),
    "env value newline": ('env:\n  X: "a\\nRUN id"\n', "env.X"),
    "env name": ("env:\n  'A B': x\n", "env.A B"),
    "label key": ("labels:\n  'a b=c': x\n", "labels.a b=c"),
    "label value newline": ('labels:\n  a.b: "x\\ny"\n', "labels.a.b"),
    "description newline": ('description: "two\\nlines"\n', "description"),
    "description control character": ('description: "bell\\a"\n', "description"),
    "cuda home": ("cuda:\n  version: 12.8.1\n  home: '/usr/local/cuda $(id)'\n", "cuda.home"),
    "component prefix": ("components:\n  nccl: {source: wheel, prefix: '/opt/nccl;id'}\n", "components.nccl.prefix"),
    "component version": ("components:\n  nccl: {source: wheel, version: '2.21.5;id'}\n", "components.nccl.version"),
    "instance type": ("platform:\n  instance_types: ['p4d 24xlarge']\n", "platform.instance_types.0"),
    "runtime env newline": ('runtime:\n  env: {X: "a\\nb"}\n', "runtime.env.X"),
    "runtime cap_add": ("runtime:\n  cap_add: ['SYS_ADMIN --privileged']\n", "runtime.cap_add.0"),
    "mpirun launcher": ("mpirun:\n  launcher: 'mpirun; id'\n", "mpirun.launcher"),
    "mpirun mca name": ("mpirun:\n  mca: {'btl x': tcp}\n", "mpirun.mca.btl x"),
    "mpirun mca value newline": ('mpirun:\n  mca: {btl: "tcp\\nid"}\n', "mpirun.mca.btl"),
    "mpirun excluded interface with a comma": ("mpirun:\n  exclude_interfaces: ['lo,eth0']\n", "exclude_interfaces.0"),
    "mpirun nccl_socket_ifname": ("mpirun:\n  nccl_socket_ifname: 'eth0 $(id)'\n", "mpirun.nccl_socket_ifname"),
    "mpirun extra_args newline": ('mpirun:\n  extra_args: ["--x\\nid"]\n', "mpirun.extra_args.0"),
}


@pytest.mark.parametrize("case", sorted(UNSAFE))
def test_unsafe_strings_are_refused_naming_file_line_and_key(tmp_path: Path, case: str) -> None:
    text, key = UNSAFE[case]
    p = write(tmp_path, "bad.yaml", "extends: cpu\n" + text)
    err = refused(cli("render", p), "bad.yaml:", key, "expected")
    assert "invalid recipe" in err


@pytest.mark.parametrize(
    "image",
    ["debian:12", "nvidia/cuda@sha256:" + "a" * 64, "host:5000/", "Debian", "a//b", "host:port/x", "x" * 300],
)
def test_a_base_image_that_is_not_an_image_name_is_refused(tmp_path: Path, image: str) -> None:
    """base.image is read with the one image-reference parser (core/imageref): a name, the tag and digest being
    base.tag and base.digest."""
    p = write(tmp_path, "bad.yaml", f"extends: cpu\nbase:\n  image: '{image}'\n")
    refused(cli("render", "--unlocked", p), "bad.yaml:3: base.image:", "expected an image name such as debian")


@pytest.mark.parametrize("image", ["host:5000/team/image", "localhost/base", "ghcr.io/org/cuda", "[::1]:5000/x"])
def test_a_base_image_on_a_registry_with_a_port_is_a_name(tmp_path: Path, image: str) -> None:
    p = write(tmp_path, "ok.yaml", f"extends: cpu\nbase:\n  image: '{image}'\n")
    proc = cli("render", "--unlocked", p)
    assert proc.returncode == 0, proc.stderr
    assert f"FROM {image}:bookworm-slim" in proc.stdout


def test_what_remains_free_text_is_quoted_in_train(tmp_path: Path) -> None:
    """mpirun values that may hold any printable text reach `train` as they are: one argument per line of its
    data (read with mapfile, never evaluated by a shell)."""
    p = write(tmp_path, "q.yaml", "extends: cpu\nmpirun:\n  mca: {btl: 'tcp,self $(id)'}\n  extra_args: [\"a'b\"]\n")
    out = tmp_path / "ctx"
    proc = cli("render", "--unlocked", p, "-o", out)
    assert proc.returncode == 0, proc.stderr
    args = (out / "imgbuild" / "sagemaker" / "mpirun.args").read_text().splitlines()
    assert args[args.index("btl") + 1] == "tcp,self $(id)" and args[args.index("btl") - 1] == "--mca"
    assert "a'b" in args


# ---- 2. ENV and LABEL hold the recipe's literal text


def test_dollar_quote_and_backslash_are_escaped_in_env_and_label(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        "dollar.yaml",
        "extends: cpu\ndescription: 'costs $5, \"quoted\", caf\u00e9'\n"
        "env:\n  PRICE: 'price ${HOME}'\n  WIN: 'C:\\dir\\'\nlabels:\n  org.example.home: $HOME\n",
    )
    proc = cli("render", "--unlocked", p)
    assert proc.returncode == 0, proc.stderr
    dockerfile = proc.stdout
    assert 'PRICE="price \\${HOME}"' in dockerfile
    assert 'WIN="C:\\\\dir\\\\"' in dockerfile
    assert 'org.example.home="\\$HOME"' in dockerfile
    assert 'org.opencontainers.image.description="costs \\$5, \\"quoted\\", caf\u00e9"' in dockerfile


def test_kvlines_refuses_a_line_break_instead_of_writing_a_broken_instruction() -> None:
    template = render.environment().from_string("ENV {{ m | kvlines('    ') }}")
    with pytest.raises(RenderError, match="one line"):
        template.render(m={"A": "x\ny"})


LITERAL = {
    "BRACED": "price ${HOME}",
    "PLAIN": "dollar $HOME and $$",
    "QUOTES": "say \"hi\" and 'bye'",
    "BACKSLASH": "C:\\dir\\ \\$HOME \\n",
    "UNICODE": "caf\u00e9 \u00fcn\u00ef \u2713",
    "EMPTY": "",
    "SPACES": "  padded  ",
}


@pytest.mark.docker
def test_docker_keeps_env_and_label_values_literal(docker_client) -> None:
    """Docker 20.10's classic builder reads back exactly what kvlines wrote (its own unescaping, for real)."""
    dockerfile = (
        render.environment()
        .from_string(
            "FROM debian:bookworm-slim\nENV {{ env | kvlines('    ') }}\nLABEL {{ labels | kvlines('      ') }}\n"
        )
        .render(env=LITERAL, labels={f"org.example.{k.lower()}": v for k, v in LITERAL.items()})
    )
    tag = f"imgbuild-test-literal:{time.monotonic_ns()}"
    image = None
    try:
        image, _ = docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True, forcerm=True)
        config = docker_client.api.inspect_image(image.id)["Config"]
        env = dict(item.split("=", 1) for item in config["Env"])
        for name, value in LITERAL.items():
            assert env[name] == value, dockerfile
            assert config["Labels"][f"org.example.{name.lower()}"] == value, dockerfile
    finally:
        if image is not None:
            docker_client.images.remove(image.id, force=True)


# ---- 3. YAML that would exhaust memory, other encodings, other files


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    lines = ["extends: cpu", "labels:", "  a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels):
        lines.append(f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("command", [("render",), ("lock", "--offline")])
def test_alias_bomb_is_refused_fast_in_bounded_memory(tmp_path: Path, command: tuple[str, ...]) -> None:
    p = write(tmp_path, "bomb.yaml", alias_bomb())
    start = time.monotonic()
    proc = cli(*command, p, limit_bytes=2 * GIB, timeout=60)
    elapsed = time.monotonic() - start
    # Refused at its first anchor, before any alias is read.
    refused(proc, "bomb.yaml:3:", "anchor (&a0)", "anchors and aliases are not allowed in recipes", "extends")
    assert elapsed < 20, f"took {elapsed:.1f} s"
    assert not (tmp_path / "bomb.lock.json").exists()


def test_anchor_alone_is_refused_too(tmp_path: Path) -> None:
    p = write(tmp_path, "anchor.yaml", "extends: cpu\ndescription: &d mine\n")
    refused(cli("render", p), "anchor.yaml:2:", "anchor (&d)")


def test_deep_nesting_is_refused(tmp_path: Path) -> None:
    p = write(tmp_path, "deep.yaml", "extends: cpu\nlabels: " + "[" * 5000 + "]" * 5000 + "\n")
    refused(cli("render", p, limit_bytes=2 * GIB), "deep.yaml:2:", "nested deeper than")


def test_oversized_file_is_refused_unread(tmp_path: Path) -> None:
    p = write(tmp_path, "big.yaml", "extends: cpu\n" + "# padding\n" * 200_000)
    refused(cli("render", p), "big.yaml:", "larger than")


def test_non_json_yaml_tags_are_refused(tmp_path: Path) -> None:
    p = write(tmp_path, "bin.yaml", "extends: cpu\ndescription: !!binary aGVsbG8=\n")
    refused(cli("render", p), "bin.yaml:2:", "binary")


def test_unquoted_date_is_text(tmp_path: Path) -> None:
    p = write(tmp_path, "date.yaml", "extends: cpu\ndescription: 2024-01-01\n")
    proc = cli("render", "--unlocked", p)
    assert proc.returncode == 0, proc.stderr
    assert 'org.opencontainers.image.description="2024-01-01"' in proc.stdout


def test_latin1_recipe_names_the_file_and_the_encoding(tmp_path: Path) -> None:
    p = tmp_path / "latin1.yaml"
    p.write_bytes("extends: cpu\ndescription: caf\u00e9\n".encode("latin-1"))
    for command in (("render",), ("lock", "--offline")):
        refused(cli(*command, p), "latin1.yaml:2:", "not UTF-8", "0xe9")


def test_control_character_in_the_file_is_refused(tmp_path: Path) -> None:
    p = write(tmp_path, "ctl.yaml", "extends: cpu\ndescription: a\x1b[31mred\n")
    err = refused(cli("render", p), "ctl.yaml:2:", "U+001B")
    assert "\x1b" not in err


def test_extends_of_another_kind_of_file_names_the_recipe_and_never_quotes_it(tmp_path: Path) -> None:
    p = write(tmp_path, "pw.yaml", "description: x\nextends: /etc/passwd\n")
    err = refused(cli("render", p), "pw.yaml:2: extends:", "shipped recipe's name or the path of a .yaml/.yml file")
    assert "root:" not in err and "/bin/" not in err


def test_extends_of_a_yaml_file_that_is_no_recipe_names_the_extends_key(tmp_path: Path) -> None:
    write(tmp_path, "list.yaml", "- root:x:0:0\n- secret\n")
    p = write(tmp_path, "child.yaml", "extends: ./list.yaml\n")
    err = refused(cli("render", p), "child.yaml:1: extends:", "list.yaml", "expected a mapping")
    assert "secret" not in err and "root:x" not in err


def test_extends_of_a_latin1_parent_names_the_extends_key(tmp_path: Path) -> None:
    (tmp_path / "parent.yaml").write_bytes("extends: cpu\ndescription: caf\u00e9\n".encode("latin-1"))
    p = write(tmp_path, "child.yaml", "extends: ./parent.yaml\n")
    refused(cli("render", p), "child.yaml:1: extends:", "parent.yaml:2:", "not UTF-8")


def test_newlines_from_the_recipe_never_reach_the_message(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        "nl.yaml",
        'extends: cpu\nenv:\n  "B\\nimgbuild: error: forged": y\nlabels:\n  "k\\nx": "v"\n',
    )
    err = refused(cli("render", p), "nl.yaml:3:", "nl.yaml:5:", r"'B\nimgbuild: error: forged'")
    assert "\nimgbuild: error: forged" not in err
    p = write(tmp_path, "ext.yaml", 'extends: "../x\\nimgbuild: error: forged"\n')
    err = refused(cli("render", p), "ext.yaml:1: extends:", r"\nimgbuild")
    assert "\nimgbuild: error: forged" not in err
