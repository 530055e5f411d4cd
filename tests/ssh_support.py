"""A real sshd on loopback for the SSH transport tests, and Secret-like credential dirs.

The daemon runs in the foreground as the test process's child with a generated host key and a
config of its own (StrictModes off: its files live in a temporary directory), and lets root in
with a generated ed25519 key. Credentials are written as a mounted Secret looks: one read-only
file per key in a directory.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from e2e_support import RunningProvider

Started = list[RunningProvider]  # the providers a test started, stopped after it

SSHD = Path("/usr/sbin/sshd")


@dataclass(frozen=True)
class SshServer:
    port: int
    process: subprocess.Popen[str]
    host_key_line: str  # for known_hosts: "[127.0.0.1]:port type base64"
    user_key: str  # the authorized private key, as a Secret holds it
    stranger_key: str  # a private key sshd does not accept
    stranger_host_key_line: str  # a known_hosts line for a host key sshd does not have

    def session_pids(self) -> list[int]:
        """The per-connection sshd processes: killing them drops the libvirt connection."""
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        return [int(pid) for pid in children.read_text().split()]


def _keypair(directory: Path, name: str) -> tuple[str, str]:
    path = directory / name
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(path)], check=True
    )
    public = " ".join(path.with_suffix(".pub").read_text().split()[:2])
    return path.read_text().strip(), public


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def running_sshd(*, password_authentication: bool = False) -> Iterator[SshServer]:
    """sshd on a free loopback port, killed on exit; passwords are refused unless asked for
    (root never logs in with one)."""
    if not SSHD.exists() or shutil.which("ssh") is None:
        pytest.fail("the SSH tests need openssh-server and openssh-client installed")
    directory = Path(tempfile.mkdtemp(prefix="pyrigaud-sshd-"))
    _, host_public = _keypair(directory, "host_key")
    user_private, user_public = _keypair(directory, "user_key")
    stranger_private, _ = _keypair(directory, "stranger_key")
    _, stranger_host_public = _keypair(directory, "stranger_host_key")
    (directory / "authorized_keys").write_text(user_public + "\n")
    port = free_loopback_port()
    config = directory / "sshd_config"
    config.write_text(
        "\n".join(
            [
                f"ListenAddress 127.0.0.1:{port}",
                f"HostKey {directory / 'host_key'}",
                f"AuthorizedKeysFile {directory / 'authorized_keys'}",
                "PidFile none",
                "StrictModes no",
                "UsePAM no",
                f"PasswordAuthentication {'yes' if password_authentication else 'no'}",
                "KbdInteractiveAuthentication no",
                "PermitRootLogin prohibit-password",
                "",
            ]
        )
    )
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
    process = subprocess.Popen(
        [str(SSHD), "-D", "-e", "-f", str(config)],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    banner = process.stderr.readline()  # blocks until sshd listens or exits
    if "Server listening" not in banner:
        process.kill()
        pytest.fail(f"sshd did not start: {banner}{process.stderr.read()}")
    try:
        yield SshServer(
            port=port,
            process=process,
            host_key_line=f"[127.0.0.1]:{port} {host_public}",
            user_key=user_private,
            stranger_key=stranger_private,
            stranger_host_key_line=f"[127.0.0.1]:{port} {stranger_host_public}",
        )
    finally:
        process.kill()
        process.wait()
        shutil.rmtree(directory, ignore_errors=True)


SecretWriter = Callable[[dict[str, str]], Path]


@contextmanager
def secret_directory() -> Iterator[SecretWriter]:
    """Writes a credentials directory like a mounted Secret (one 0444 file per key); calling
    it again replaces the files (a rotation)."""
    directory = Path(tempfile.mkdtemp(prefix="pyrigaud-secret-"))

    def write(values: dict[str, str]) -> Path:
        for stale in directory.iterdir():
            stale.unlink()
        for key, value in values.items():
            path = directory / key
            path.write_text(value + "\n")
            os.chmod(path, 0o444)
        return directory

    yield write
    shutil.rmtree(directory, ignore_errors=True)
