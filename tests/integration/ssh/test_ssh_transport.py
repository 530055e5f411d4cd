"""pyrigaud through gRPC, reaching the real libvirtd over SSH with credentials from a Secret."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb

from support.e2e import RunningProvider, create_vm, start_provider
from support.qemu import TEST_POOL
from support.ssh import SecretWriter, SshServer, Started, good_secret

TRANSPORTS = ("ssh", "libssh")


def serve(
    started: Started, sshd: SshServer, secret: Path, transport: str = "ssh", **extra: str
) -> RunningProvider:
    """A provider on the real daemon at root@127.0.0.1 (the user comes from the Secret)."""
    running = start_provider(
        {
            "PROVIDER_TYPE": "libvirt",
            "PROVIDER_ENDPOINT": f"qemu+{transport}://127.0.0.1:{sshd.port}/system",
            "PYRIGAUD_CREDENTIALS": "files",
            "PYRIGAUD_CREDENTIALS_DIR": str(secret),
            "LIBVIRT_DOMAIN_TYPE": "qemu",
            "PROVIDER_DEFAULT_DATASTORE": TEST_POOL,
            **extra,
        }
    )
    started.append(running)
    return running


def validate(running: RunningProvider) -> pb.ValidateResponse:
    return running.stub.Validate(pb.ValidateRequest(), timeout=120)


@pytest.mark.usefixtures("test_pool")
def test_create_describe_delete_over_ssh(
    sshd: SshServer, write_secret: SecretWriter, started: Started
) -> None:
    running = serve(started, sshd, write_secret(good_secret(sshd)))
    answer = validate(running)
    assert answer.ok, answer.message
    vm_id = create_vm(running.stub, "ssh-round-trip")
    described = running.stub.Describe(pb.DescribeRequest(id=vm_id), timeout=60)
    assert described.exists
    running.stub.Delete(pb.DeleteRequest(id=vm_id), timeout=60)
    assert not running.stub.Describe(pb.DescribeRequest(id=vm_id), timeout=60).exists


def test_libssh_transport_validates(
    sshd: SshServer, write_secret: SecretWriter, started: Started
) -> None:
    answer = validate(serve(started, sshd, write_secret(good_secret(sshd)), "libssh"))
    assert answer.ok, answer.message


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_unknown_host_key_fails_validate_without_secrets(
    sshd: SshServer, write_secret: SecretWriter, started: Started, transport: str
) -> None:
    secret = {**good_secret(sshd), "known_hosts": sshd.stranger_host_key_line}
    answer = validate(serve(started, sshd, write_secret(secret), transport))
    assert not answer.ok
    assert "host key verification" in answer.message.lower()
    assert "PRIVATE KEY" not in answer.message
    assert sshd.user_key.splitlines()[1] not in answer.message


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_skipping_host_key_verification_connects_to_an_unknown_host(
    sshd: SshServer, write_secret: SecretWriter, started: Started, transport: str
) -> None:
    secret = {**good_secret(sshd), "known_hosts": sshd.stranger_host_key_line}
    running = serve(
        started,
        sshd,
        write_secret(secret),
        transport,
        LIBVIRT_INSECURE_SKIP_HOST_KEY_VERIFICATION="true",
    )
    answer = validate(running)
    assert answer.ok, answer.message


def test_a_rotated_key_is_used_without_a_restart(
    sshd: SshServer, write_secret: SecretWriter, started: Started
) -> None:
    secret = write_secret({**good_secret(sshd), "ssh-privatekey": sshd.stranger_key})
    running = serve(started, sshd, secret)
    refused = validate(running)
    assert not refused.ok
    assert "permission denied" in refused.message.lower()
    write_secret(good_secret(sshd))
    answer = validate(running)
    assert answer.ok, answer.message


def test_a_dropped_session_is_reopened_and_counted(
    sshd: SshServer, write_secret: SecretWriter, started: Started
) -> None:
    running = serve(started, sshd, write_secret(good_secret(sshd)))
    assert validate(running).ok
    for pid in sshd.session_pids():
        os.kill(pid, signal.SIGKILL)
    answer = validate(running)
    assert answer.ok, answer.message
    reconnects = running.application.container.metrics().registry.get_sample_value(
        "pyrigaud_session_reconnects_total", {"backend": "libvirt"}
    )
    assert reconnects == 1.0
