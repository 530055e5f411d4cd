"""The SSH transport tests need the real libvirtd: run only with PYRIGAUD_TEST_QEMU=1, shown
skipped otherwise (see support.qemu and tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.qemu import ensure_test_pool, open_qemu, remove_test_leftovers
from support.ssh import (
    SaslDaemon,
    SecretWriter,
    SshServer,
    Started,
    running_sshd,
    sasl_libvirtd,
    secret_directory,
)


@pytest.fixture(scope="module")
def sshd() -> Iterator[SshServer]:
    with running_sshd() as server:
        yield server


@pytest.fixture(scope="module")
def sasl_daemon() -> Iterator[SaslDaemon]:
    """An unprivileged libvirtd on loopback that asks for a SASL password over TCP."""
    with sasl_libvirtd() as daemon:
        yield daemon


@pytest.fixture
def write_secret() -> Iterator[SecretWriter]:
    with secret_directory() as write:
        yield write


@pytest.fixture
def test_pool() -> Iterator[None]:
    """The real daemon's test pool, and nothing of the tests' left in it afterwards."""
    conn = open_qemu()
    try:
        ensure_test_pool(conn)
        remove_test_leftovers(conn)
        yield
        remove_test_leftovers(conn)
    finally:
        conn.close()


@pytest.fixture
def started() -> Iterator[Started]:
    """The providers a test started through `serve`, stopped after it."""
    providers: Started = []
    yield providers
    for running in providers:
        running.channel.close()
        running.application.stop(0)
