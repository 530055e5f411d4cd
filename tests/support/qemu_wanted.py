"""Whether this run wants the real libvirtd + QEMU, and how the tests that need it are told
apart: light enough for tests/conftest.py to import in a process without libvirt-python (the
NFS staging tests run in a Debian 13 root that has none)."""

from __future__ import annotations

import os
from typing import Any

import pytest

ENABLE_VARIABLE = "PYRIGAUD_TEST_QEMU"
# Every test module under these folders (relative to tests/) needs the daemon.
QEMU_FOLDERS = ("integration/qemu", "integration/guest", "integration/ssh")
QEMU_NOT_WANTED = (
    f"needs the real libvirtd + QEMU, not wanted in this run: {ENABLE_VARIABLE}=1 wants it "
    "(scripts/test sets it after scripts/libvirtd.sh)"
)


def qemu_enabled() -> bool:
    return os.environ.get(ENABLE_VARIABLE) == "1"


def qemu_param(*values: object) -> Any:
    """A parameter set (a backend's name) that needs the daemon: marked `qemu`, so a run that
    does not want QEMU shows its tests skipped instead of leaving them out."""
    return pytest.param(*values, marks=pytest.mark.qemu)
