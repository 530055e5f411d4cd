"""Real libvirtd + QEMU tests: collected only with PYRIGAUD_TEST_QEMU=1 (see support.qemu)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from support.qemu import QemuHost, open_qemu, qemu_enabled, qemu_host

# Without the daemon (a developer run without root) these are not collected, never skipped.
collect_ignore_glob = [] if qemu_enabled() else ["test_*.py"]


@pytest.fixture
def qemu() -> Iterator[QemuHost]:
    yield from qemu_host()


@pytest.fixture
def conn(qemu: QemuHost) -> Iterator[Any]:
    """A raw connection to look at what the backend made, opened after the harness's cleanup."""
    connection = open_qemu()
    yield connection
    connection.close()
