"""Real libvirtd + QEMU tests: run only with PYRIGAUD_TEST_QEMU=1, shown skipped otherwise
(see support.qemu and tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from support.qemu import QemuHost, open_qemu, qemu_host


@pytest.fixture
def qemu() -> Iterator[QemuHost]:
    yield from qemu_host()


@pytest.fixture
def conn(qemu: QemuHost) -> Iterator[Any]:
    """A raw connection to look at what the backend made, opened after the harness's cleanup."""
    connection = open_qemu()
    yield connection
    connection.close()
