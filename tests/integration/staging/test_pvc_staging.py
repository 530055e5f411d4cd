"""What only a PVC has: a mount that may be missing, symbolic links that may lead out, and a file
system of its own that may fill up."""

from __future__ import annotations

import os
from pathlib import Path

from pyrigaud.adapters.clocks import SystemClock
from pyrigaud.adapters.staging.pvc import PvcStaging
from pyrigaud.adapters.staging.pvc_location import PVC
from pyrigaud.adapters.staging.registry import STAGING_TYPES
from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.staging import StagedLocation

from support import error_of, ok
from support.small_filesystem import small_filesystem


def locate(url: str) -> StagedLocation:
    return ok(STAGING_TYPES.parse_location("source_url", url, PVC, {}, {}))


def test_a_pvc_that_is_not_mounted_is_a_failed_precondition(tmp_path: Path) -> None:
    error = error_of(
        PvcStaging(root=str(tmp_path), clock=SystemClock()).open_read(
            locate("pvc://absent/x.qcow2")
        )
    )
    assert error.kind is ErrorKind.FAILED_PRECONDITION
    assert "absent" in error.message


def test_a_symbolic_link_out_of_the_pvc_is_refused(tmp_path: Path) -> None:
    (tmp_path / "mig").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "mig" / "escape").symlink_to(tmp_path / "outside")
    staging = PvcStaging(root=str(tmp_path), clock=SystemClock())
    for result in (
        staging.open_write(locate("pvc://mig/escape/x.qcow2")),
        staging.open_read(locate("pvc://mig/escape/x.qcow2")),
    ):
        error = error_of(result)
        assert error.kind is ErrorKind.INVALID_SPEC
        assert error.message.startswith("source_url:")
    assert list((tmp_path / "outside").iterdir()) == []


def test_a_full_pvc_is_resource_exhausted_and_keeps_nothing_of_the_write() -> None:
    """The PVC fills up mid-write: RESOURCE_EXHAUSTED, naming the object; the temporary goes,
    and an object staged there before stays as it was."""
    with small_filesystem(2 * 1024**2) as root:
        (root / "mig").mkdir()
        staging = PvcStaging(root=str(root), clock=SystemClock())
        location = locate("pvc://mig/disk.qcow2")
        (root / "mig" / "disk.qcow2").write_bytes(b"before")
        writer = ok(staging.open_write(location, 4 * 1024**2))
        written = writer.write(os.urandom(4 * 1024**2)).bind(lambda _: writer.commit())

        full = error_of(written)
        assert full.kind is ErrorKind.RESOURCE_EXHAUSTED
        assert "pvc://mig/disk.qcow2" in full.message
        assert "No space left on device" in full.message
        assert [path.name for path in (root / "mig").iterdir()] == ["disk.qcow2"]
        assert (root / "mig" / "disk.qcow2").read_bytes() == b"before"
