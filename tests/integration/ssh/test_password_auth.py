"""pyrigaud through gRPC, logging in to libvirt with a password from a Secret: over SSH to the
real system daemon, and over TCP to a daemon that asks for it through SASL.

SSH: the login is a throwaway local account with a random password, in the `libvirt` group.
The daemon's socket is polkit-guarded and this machine runs no polkit, so the account reaches
the daemon through a relay socket of its own that the test process (root) forwards to the
daemon's; the remote side runs a small netcat stand-in (libvirt's `proxy=netcat` mode) for the
relay. What is under test is the SSH side: libvirt's libssh transport asking the auth callback
for the password, and the callback answering from the credentials port.

TCP: a second, unprivileged libvirtd asks for a SASL password (support/ssh.py).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

import pytest

from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb

from support.e2e import RunningProvider, create_vm, start_provider
from support.qemu import TEST_POOL
from support.ssh import (
    SASL_USER,
    SaslDaemon,
    SecretWriter,
    SshServer,
    Started,
    running_sshd,
    throwaway_account,
)

DAEMON_SOCKET = "/run/libvirt/libvirt-sock"
CHUNK = 65536
# What libvirt runs remotely as `<netcat> [-q0] -U <socket>`: stdin/stdout to a unix socket.
NETCAT_STAND_IN = """#!/usr/bin/python3
import os, socket, sys, threading
if "-U" not in sys.argv:
    sys.exit(0)  # libvirt's probe for `-q`: no flags to learn here
daemon = socket.socket(socket.AF_UNIX)
daemon.connect(sys.argv[sys.argv.index("-U") + 1])
def upstream():
    while data := os.read(0, 65536):
        daemon.sendall(data)
    daemon.shutdown(socket.SHUT_WR)
threading.Thread(target=upstream, daemon=True).start()
while data := daemon.recv(65536):
    os.write(1, data)
"""


@dataclass(frozen=True)
class PasswordLogin:
    user: str
    password: str
    endpoint_query: str  # where the remote side finds the relay


class DaemonRelay:
    """A unix socket only `uid` may use, each connection forwarded to the daemon's socket."""

    def __init__(self, path: Path, uid: int) -> None:
        self._listener = socket.socket(socket.AF_UNIX)
        self._listener.bind(str(path))
        os.chown(path, uid, -1)
        path.chmod(0o600)
        self._listener.listen()
        threading.Thread(target=self._accept, name="daemon-relay", daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):  # closed: the test is over
            while True:
                client, _ = self._listener.accept()
                daemon = socket.socket(socket.AF_UNIX)
                daemon.connect(DAEMON_SOCKET)
                for source, sink in ((client, daemon), (daemon, client)):
                    threading.Thread(target=_pump, args=(source, sink), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(CHUNK):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)


@pytest.fixture(scope="module")
def password_sshd() -> Iterator[SshServer]:
    with running_sshd(password_authentication=True) as server:
        yield server


@pytest.fixture
def login() -> Iterator[PasswordLogin]:
    """A local account with a random password that reaches the daemon through a relay."""
    password = secrets.token_urlsafe(24)
    with throwaway_account("libvirt") as (account, directory):
        subprocess.run(["chpasswd"], input=f"{account.pw_name}:{password}\n", text=True, check=True)
        netcat = directory / "netcat"
        netcat.write_text(NETCAT_STAND_IN)
        netcat.chmod(0o755)
        relay = DaemonRelay(directory / "libvirt-sock", account.pw_uid)
        query = urlencode(
            {"socket": directory / "libvirt-sock", "proxy": "netcat", "netcat": netcat}
        )
        try:
            yield PasswordLogin(account.pw_name, password, query)
        finally:
            relay.close()


def serve(started: Started, endpoint: str, secret: Path) -> RunningProvider:
    """A provider on `endpoint`; user and password come from the Secret."""
    running = start_provider(
        {
            "PROVIDER_TYPE": "libvirt",
            "PROVIDER_ENDPOINT": endpoint,
            "PYRIGAUD_CREDENTIALS": "files",
            "PYRIGAUD_CREDENTIALS_DIR": str(secret),
            "LIBVIRT_DOMAIN_TYPE": "qemu",
            "PROVIDER_DEFAULT_DATASTORE": TEST_POOL,
        }
    )
    started.append(running)
    return running


def over_ssh(
    started: Started, sshd: SshServer, login: PasswordLogin, secret: Path
) -> RunningProvider:
    """On the real system daemon over libssh."""
    endpoint = f"qemu+libssh://127.0.0.1:{sshd.port}/system?{login.endpoint_query}"
    return serve(started, endpoint, secret)


def over_tcp(started: Started, daemon: SaslDaemon, secret: Path) -> RunningProvider:
    return serve(started, daemon.uri, secret)


def password_secret(sshd: SshServer, login: PasswordLogin, password: str) -> dict[str, str]:
    """No key: the password is the only way in."""
    return {"username": login.user, "password": password, "known_hosts": sshd.host_key_line}


def validate(running: RunningProvider) -> pb.ValidateResponse:
    return running.stub.Validate(pb.ValidateRequest(), timeout=120)


@pytest.mark.usefixtures("test_pool")
def test_create_describe_delete_with_a_password(
    password_sshd: SshServer, login: PasswordLogin, write_secret: SecretWriter, started: Started
) -> None:
    secret = write_secret(password_secret(password_sshd, login, login.password))
    running = over_ssh(started, password_sshd, login, secret)
    answer = validate(running)
    assert answer.ok, answer.message
    vm_id = create_vm(running.stub, "password-round-trip")
    assert running.stub.Describe(pb.DescribeRequest(id=vm_id), timeout=60).exists
    running.stub.Delete(pb.DeleteRequest(id=vm_id), timeout=60)
    assert not running.stub.Describe(pb.DescribeRequest(id=vm_id), timeout=60).exists


def test_a_wrong_password_fails_validate_without_showing_it(
    password_sshd: SshServer, login: PasswordLogin, write_secret: SecretWriter, started: Started
) -> None:
    wrong = secrets.token_urlsafe(24)
    secret = write_secret(password_secret(password_sshd, login, wrong))
    answer = validate(over_ssh(started, password_sshd, login, secret))
    assert not answer.ok
    assert "authentication failed" in answer.message.lower()
    assert wrong not in answer.message
    assert login.password not in answer.message


def test_a_rotated_password_is_used_without_a_restart(
    password_sshd: SshServer, login: PasswordLogin, write_secret: SecretWriter, started: Started
) -> None:
    stale = secrets.token_urlsafe(24)
    secret = write_secret(password_secret(password_sshd, login, stale))
    running = over_ssh(started, password_sshd, login, secret)
    assert not validate(running).ok
    write_secret(password_secret(password_sshd, login, login.password))
    answer = validate(running)
    assert answer.ok, answer.message


def test_a_sasl_password_over_tcp_validates_and_lists(
    sasl_daemon: SaslDaemon, write_secret: SecretWriter, started: Started
) -> None:
    secret = write_secret({"username": SASL_USER, "password": sasl_daemon.password})
    running = over_tcp(started, sasl_daemon, secret)
    answer = validate(running)
    assert answer.ok, answer.message
    running.stub.ListVMs(pb.ListVMsRequest(), timeout=60)


def test_a_wrong_sasl_password_fails_validate_and_a_rotated_one_is_used(
    sasl_daemon: SaslDaemon, write_secret: SecretWriter, started: Started
) -> None:
    wrong = secrets.token_urlsafe(24)
    secret = write_secret({"username": SASL_USER, "password": wrong})
    running = over_tcp(started, sasl_daemon, secret)
    refused = validate(running)
    assert not refused.ok
    assert "authentication failed" in refused.message.lower()
    assert wrong not in refused.message
    write_secret({"username": SASL_USER, "password": sasl_daemon.password})
    answer = validate(running)
    assert answer.ok, answer.message
