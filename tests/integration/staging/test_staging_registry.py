"""One StagingStorage for all backends: each location reaches its own adapter."""

from __future__ import annotations

from pathlib import Path

from pyrigaud.adapters.clocks import SystemClock
from pyrigaud.adapters.staging.nfs_location import NFS
from pyrigaud.adapters.staging.pvc import PvcStaging
from pyrigaud.adapters.staging.pvc_location import PVC
from pyrigaud.adapters.staging.registry import STAGING_TYPES, StagingByType
from pyrigaud.adapters.staging.s3_location import S3
from pyrigaud.domain.errors import ErrorKind

from support import error_of, ok


def test_every_backend_is_served_where_its_libraries_are_installed(tmp_path: Path) -> None:
    staging = STAGING_TYPES.stores("pyrigaud", SystemClock(), pvc_root=str(tmp_path))
    assert staging.types == (PVC, NFS, S3)
    (tmp_path / "mig").mkdir()
    location = ok(STAGING_TYPES.parse_location("destination_url", "pvc://mig/x.raw", PVC, {}, {}))
    writer = ok(staging.open_write(location))
    ok(writer.write(b"raw"))
    ok(writer.commit())
    assert (tmp_path / "mig" / "x.raw").read_bytes() == b"raw"
    staged = ok(staging.open_file(location))
    assert staged is not None  # a PVC's own file, through the dispatch
    staged.file.write(b"in place")
    ok(staged.commit())
    assert (tmp_path / "mig" / "x.raw").read_bytes() == b"in place"


def test_a_backend_without_an_adapter_is_unsupported(tmp_path: Path) -> None:
    staging = StagingByType(
        STAGING_TYPES, {PVC: PvcStaging(root=str(tmp_path), clock=SystemClock())}
    )
    location = ok(
        STAGING_TYPES.parse_location(
            "source_url",
            "nfs://127.0.0.1/export/x.qcow2",
            NFS,
            {"export": "/export"},
            {},
        )
    )
    for result in (
        staging.open_read(location),
        staging.open_write(location),
        staging.open_file(location),
        staging.sweep(location, 0),
    ):
        assert error_of(result).kind is ErrorKind.UNSUPPORTED
