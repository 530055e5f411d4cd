"""A file system with little room, for what a full PVC or scratch directory does to a transfer.

A tmpfs of the asked size is mounted in a mount namespace of its own (`unshare`, as root), held
by a process that only sleeps; the test reaches it through that process's `/proc/<pid>/root`,
which resolves paths as the process sees them, its private mounts included. The machine's mount
table never shows it, and it goes with the process, whatever the test left in it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

MOUNT_SOURCE = "pyrigaud-small"
HOLDER = f"""
set -eu
mount -t tmpfs -o "size=$2,mode=0755" {MOUNT_SOURCE} "$1"
echo mounted
exec sleep infinity
"""
START_SECONDS = 30


@contextlib.contextmanager
def small_filesystem(size_bytes: int) -> Iterator[Path]:
    """A directory on a fresh tmpfs of `size_bytes`, as a path this process can use; skips the
    test where namespaces or mounts are not permitted."""
    if os.geteuid() != 0:
        pytest.skip("needs root: a tmpfs in a mount namespace of its own")
    mount_point = Path(tempfile.mkdtemp(prefix="pyrigaud-small-"))
    holder = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", HOLDER, "holder",
         str(mount_point), str(size_bytes)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        if holder.stdout.readline().strip() != "mounted":
            holder.wait(timeout=START_SECONDS)
            assert holder.stderr is not None
            pytest.skip(f"a tmpfs in a mount namespace is not permitted: {holder.stderr.read()}")
        yield Path(f"/proc/{holder.pid}/root{mount_point}")
    finally:
        holder.kill()
        holder.communicate(timeout=START_SECONDS)
        shutil.rmtree(mount_point)
