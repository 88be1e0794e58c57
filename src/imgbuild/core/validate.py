"""What a user types on the command line that lands in a generated script, a job, a command line or a log, checked
for what it is before anything is written: an image reference (Docker's reference grammar), an EC2 instance type
(`family.size`), a host name (RFC 1123, or an IP address), a user name, a DNS label, a Kubernetes quantity.

Each grammar starts with a letter or a digit (an IP address, a bracketed IPv6 address): none of these values can
become an option of the program it is handed to (a leading `-`), and none holds a character a shell, YAML or a
comment line would read as more than text (no space, quote, `$`, backquote, `;`, newline or other control
character). Where free text reaches a script anyway (the command after `--`), the writer quotes it
(shlex.quote for shell, the YAML emitter for Kubernetes objects).

Each function returns the value when it is of its form and raises ValueError saying what was expected otherwise;
`option` makes one a typer callback, so that a malformed option is a usage error (exit 2) naming the option.
A leaf module: schema.py's recipe types and the cluster commands share these grammars.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar

from imgbuild.core import imageref

T = TypeVar("T")

# Docker's image reference grammar lives once, in core/imageref.py; `redact` finds digests with it.
# The `_..._RE` patterns below are strings, flags inline, compiled on first use (re's functions keep them in re's own
# cache): every command imports this module, and most use none of them.
_DIGEST = imageref.DIGEST

# EC2 instance types: FAMILY.SIZE (p4d.24xlarge, p6e-gb200.36xlarge, u-6tb1.112xlarge, r7iz.metal-32xl), which is
# also what the `node.kubernetes.io/instance-type` label holds (a label value: at most 63 characters).
INSTANCE_TYPE_PATTERN = r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*\.[a-z0-9]+(?:-[a-z0-9]+)*"
INSTANCE_TYPE_EXPECTED = "an EC2 instance type FAMILY.SIZE of lowercase letters, digits and '-' (p4d.24xlarge)"
INSTANCE_TYPE_MAX = 63
_INSTANCE_TYPE_RE = f"(?a){INSTANCE_TYPE_PATTERN}"

# RFC 1123 host names: labels of letters, digits and '-' (not first or last), at most 63 characters each, 253 in all.
_HOST_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST_RE = rf"(?a){_HOST_LABEL}(?:\.{_HOST_LABEL})*\.?"
HOST_MAX = 253

# POSIX portable user names as useradd takes them (shadow's default NAME_REGEX, without the trailing '$').
_USER_RE = r"(?a)[a-z_][a-z0-9_-]{0,31}"

# A DNS label (RFC 1123), as Kubernetes names objects.
_DNS_LABEL_RE = r"(?a)[a-z]([-a-z0-9]*[a-z0-9])?"

# A Kubernetes quantity, in the forms a memory limit takes.
_QUANTITY_RE = r"(?a)\d+(\.\d+)?(Ki|Mi|Gi|Ti|k|M|G|T)?"


# Credentials in a URL or a reference: `USER:SECRET@` anywhere (`https://u:token@host`, `type=registry,ref=u:p@host/x`,
# `ssh://u:pw@host`), and a bare `TOKEN@` after http(s)://. `NAME:TAG@sha256:HEX` is a reference's digest, not a secret.
# USER:SECRET@ is matched in the reversed text, from each `@` backwards (a secret holds no `@`: RFC 3986 has it
# percent-encoded there), so that the time is linear in the text's length whatever it holds: a message can quote
# megabytes of a log, and a pattern read forwards would try each `:` against the whole run after it.
_USERINFO_REVERSED_RE = r"(?a)@(?P<secret>[^\s/@'\"]*):(?P<user>[^\s/@:'\"=,;()\[\]]+)"
_DIGEST_RE = "(?a)" + _DIGEST + r"(?![0-9a-fA-F])"
_TOKEN_RE = r"(?ai)(?P<scheme>\bhttps?://)(?P<token>[^\s/@:'\"]+)@"
REDACTED = "***"


def redact(text: str) -> str:
    """`text` with the secret of every credential in it replaced by ***: `user:***@host`, `https://***@host`. Every
    error (`errors.ImgbuildError`) and every value a check quotes (`shown`) goes through it."""
    if "@" not in text:
        return text
    last = len(text) - 1

    def hide(m: re.Match[str]) -> str:  # m is in the reversed text; `at` is the `@`'s place in `text`
        at = last - m.start()
        if re.compile(_DIGEST_RE).match(text, at + 1):
            return m.group(0)
        return f"@{REDACTED}:{m['user']}"

    text = re.sub(_USERINFO_REVERSED_RE, hide, text[::-1])[::-1]
    return re.sub(_TOKEN_RE, lambda m: f"{m['scheme']}{REDACTED}@", text)


def shown(value: str) -> str:
    """The value as an error message shows it: credentials redacted, quoted, control characters escaped, long ones
    cut."""
    value = redact(value)
    return repr(value if len(value) <= 80 else value[:77] + "...")


def argument(value: str, what: str) -> str:
    """`value` when it can be handed to another program (ssh, docker, uv, pip ...) as an argument: one that starts
    with `-` would be read as an option of that program (`ssh -oProxyCommand=...`), so it is refused, naming `what`
    (the option or variable it came from). Callers also put `--` before it where the program takes one."""
    if value.startswith("-"):
        raise ValueError(
            f"{what}: expected a value, got {shown(value)}: a value starting with '-' would be read as an option of "
            "the program it is passed to"
        )
    return value


def image_ref(value: str) -> str:
    """A Docker image reference: [REGISTRY[:PORT]/]REPOSITORY[:TAG][@DIGEST]."""
    expected = (
        "a Docker image reference [REGISTRY[:PORT]/]REPOSITORY[:TAG][@sha256:DIGEST] "
        "(lowercase repository, e.g. 123456789012.dkr.ecr.us-east-1.amazonaws.com/imgbuild/a100:v1)"
    )
    try:
        imageref.parse(value)
    except ValueError:
        raise ValueError(f"expected {expected}, got {shown(value)}") from None
    return value


def instance_type(value: str) -> str:
    """An EC2 instance type (family.size)."""
    if len(value) > INSTANCE_TYPE_MAX or re.fullmatch(_INSTANCE_TYPE_RE, value) is None:
        raise ValueError(
            f"expected {INSTANCE_TYPE_EXPECTED}, at most {INSTANCE_TYPE_MAX} characters, got {shown(value)}"
        )
    return value


def host(value: str) -> str:
    """A host name (RFC 1123) or an IP address (without an IPv6 scope: `%` takes any text after it)."""
    if "%" not in value:
        try:
            import ipaddress

            ipaddress.ip_address(value)
            return value
        except ValueError:
            pass
    if len(value) > HOST_MAX or re.fullmatch(_HOST_RE, value) is None:
        raise ValueError(
            "expected a host name (RFC 1123: letters, digits and '-' in dot-separated labels, not starting or "
            f"ending with '-') or an IP address, got {shown(value)}"
        )
    return value


def hosts(value: str) -> list[str]:
    """A comma-separated list of host names or addresses (empty items are dropped), each checked by `host`."""
    names = [h.strip() for h in value.split(",") if h.strip()]
    if not names:
        raise ValueError(f"expected one host or more, separated by commas (10.0.0.1,10.0.0.2), got {shown(value)}")
    for name in names:
        host(name)
    return names


def user_name(value: str) -> str:
    """A user name to log in as (root, ubuntu, ec2-user)."""
    if re.fullmatch(_USER_RE, value) is None:
        raise ValueError(
            "expected a user name (lowercase letters, digits, '_' and '-', not starting with a digit or '-', at "
            f"most 32 characters), got {shown(value)}"
        )
    return value


def dns_label(value: str, max_length: int = 63) -> str:
    """A DNS label (RFC 1123) of at most `max_length` characters, starting with a letter."""
    if len(value) > max_length or re.fullmatch(_DNS_LABEL_RE, value) is None:
        raise ValueError(
            f"expected a DNS label (a-z, 0-9 and '-', starting with a letter) of at most {max_length} characters, "
            f"got {shown(value)}"
        )
    return value


def quantity(value: str) -> str:
    """A Kubernetes quantity (32Gi, 64000Mi)."""
    if re.fullmatch(_QUANTITY_RE, value) is None:
        raise ValueError(f"expected a Kubernetes quantity such as 32Gi or 64000Mi, got {shown(value)}")
    return value


def option(check: Callable[[str], T]) -> Callable[[str | None], T | None]:
    """`check` as a typer option callback: None passes, a ValueError is a usage error naming the option."""

    def callback(value: str | None) -> T | None:
        import typer

        if value is None:
            return None
        try:
            return check(value)
        except ValueError as exc:
            raise typer.BadParameter(redact(str(exc))) from None

    return callback
