"""The sshd block: sshd.py (its options, pin rule, contribution and checks), sshd.j2 (its Dockerfile
fragments), files/ (its scripts)."""

from imgbuild.blocks.sshd.sshd import (
    BLOCK,
    DEFAULT_PORT,
    SSH_KEY_DIR,
    SSHD_LOG,
    Sshd,
    listening_ports,
    sshd_config,
)

__all__ = [
    "BLOCK",
    "DEFAULT_PORT",
    "SSHD_LOG",
    "SSH_KEY_DIR",
    "Sshd",
    "listening_ports",
    "sshd_config",
]
