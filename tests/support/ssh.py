"""A real sshd on loopback for the remote-transport tests, a libvirtd asking for a SASL password
over TCP, and Secret-like credential dirs.

The SSH daemon runs in the foreground as the test process's child with a generated host key and a
config of its own (StrictModes off: its files live in a temporary directory), and lets root in
with a generated ed25519 key. Credentials are written as a mounted Secret looks: one read-only
file per key in a directory.

The system libvirtd cannot be restarted with a listener under the other tests, so a second,
unprivileged libvirtd (its `qemu:///session`, run as a throwaway local account) listens on
loopback with `auth_tcp = "sasl"`, a DIGEST-MD5 sasldb of its own (libvirt offers only
mechanisms with a security layer on plain TCP) and a random password.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.e2e import RunningProvider
from support.ports import free_port

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
    port = free_port()
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


def good_secret(sshd: SshServer) -> dict[str, str]:
    """The Secret that lets a provider in as root with the authorized key."""
    return {
        "username": "root",
        "ssh-privatekey": sshd.user_key,
        "known_hosts": sshd.host_key_line,
    }


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


LIBVIRTD = Path("/usr/sbin/libvirtd")
SASLPASSWD = Path("/usr/sbin/saslpasswd2")
SASL_USER = "pyrigaud"
DAEMON_START_SECONDS = 60.0


@contextmanager
def throwaway_account(*groups: str) -> Iterator[tuple[pwd.struct_passwd, Path]]:
    """A local account and a directory it owns (others may read), both removed afterwards."""
    user = f"pyrigaud-pw-{secrets.token_hex(4)}"
    directory = Path(tempfile.mkdtemp(prefix="pyrigaud-account-"))
    home = ["--no-create-home", "--home-dir", str(directory), "--shell", "/bin/sh"]
    membership = ["--groups", ",".join(groups)] if groups else []
    subprocess.run(["useradd", *home, *membership, user], check=True)
    try:
        account = pwd.getpwnam(user)
        directory.chmod(0o755)
        os.chown(directory, account.pw_uid, account.pw_gid)
        yield account, directory
    finally:
        # --force: an SSH session of a closed connection may still be on its way out.
        subprocess.run(["userdel", "--force", user], check=True)
        shutil.rmtree(directory, ignore_errors=True)


@dataclass(frozen=True)
class SaslDaemon:
    port: int
    password: str  # SASL_USER's
    home: Path  # the daemon's account's directory (its own files may go here)

    @property
    def uri(self) -> str:
        return f"qemu+tcp://127.0.0.1:{self.port}/session"


@contextmanager
def sasl_libvirtd() -> Iterator[SaslDaemon]:
    """An unprivileged libvirtd whose TCP listener on loopback asks for a SASL password."""
    for needed in (LIBVIRTD, SASLPASSWD):
        if not needed.exists():
            pytest.fail(f"the SASL test needs {needed} (libvirt-daemon, sasl2-bin)")
    password = secrets.token_urlsafe(24)
    port = free_port()
    with throwaway_account() as (account, directory):
        sasldb = directory / "passwd.db"
        (directory / "libvirt.conf").write_text(f"mech_list: digest-md5\nsasldb_path: {sasldb}\n")
        subprocess.run(
            [str(SASLPASSWD), "-p", "-c", "-a", "libvirt", "-f", str(sasldb), SASL_USER],
            input=password,
            text=True,
            check=True,
        )
        os.chown(sasldb, account.pw_uid, account.pw_gid)
        config = directory / "libvirtd.conf"
        config.write_text(
            'listen_tls = 0\nlisten_tcp = 1\nlisten_addr = "127.0.0.1"\n'
            f'tcp_port = "{port}"\nauth_tcp = "sasl"\n'
        )
        environment = {
            "PATH": os.environ["PATH"],
            "HOME": str(directory),
            "XDG_RUNTIME_DIR": str(directory / "run"),
            "SASL_CONF_PATH": str(directory),  # libvirt.conf: the mechanism and the sasldb
        }
        with (directory / "libvirtd.log").open("w") as log:
            daemon = subprocess.Popen(
                [str(LIBVIRTD), "--listen", "-f", str(config)],
                user=account.pw_uid,
                group=account.pw_gid,
                extra_groups=[],
                env=environment,
                cwd=directory,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            _wait_until_listening(daemon, port, directory / "libvirtd.log")
            yield SaslDaemon(port, password, directory)
        finally:
            daemon.kill()
            daemon.wait()


def _wait_until_listening(daemon: subprocess.Popen[bytes], port: int, log: Path) -> None:
    """libvirtd says nowhere when it listens: try the port until it answers (bounded)."""
    deadline = time.monotonic() + DAEMON_START_SECONDS
    while daemon.poll() is None and time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    daemon.kill()
    pytest.fail(f"libvirtd did not listen on 127.0.0.1:{port}: {log.read_text()[-2000:]}")
