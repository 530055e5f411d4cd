"""The SSH transport tests need the real libvirtd: collected only with PYRIGAUD_TEST_QEMU=1."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from qemu_support import ensure_test_pool, open_qemu, qemu_enabled, remove_test_leftovers
from ssh_support import SecretWriter, SshServer, running_sshd, secret_directory

collect_ignore_glob = [] if qemu_enabled() else ["test_*.py"]

# libvirt's ssh transport forks the ssh binary from a gRPC worker thread; gRPC's fork handlers
# then restart its poller in the child, which races libvirt closing the child's descriptors and
# can kill the child before it execs ssh. A process serving gRPC must start with them off.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")


@pytest.fixture(scope="module")
def sshd() -> Iterator[SshServer]:
    with running_sshd() as server:
        yield server


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
