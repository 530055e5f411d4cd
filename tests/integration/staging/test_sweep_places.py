"""The staging places the leftover sweep visits with no request naming them
(PYRIGAUD_STAGING_SWEEP_PLACES): a transfer killed with SIGKILL in a migration's folder of an S3
bucket or an NFS export leaves temporaries that the sweep of the place removes, with the
credentials read from a mounted Secret's directory, at a provider's start-up too."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from pyrigaud.adapters.clocks import SystemClock
from pyrigaud.adapters.credentials.mounted_secret import MountedSecretCredentials
from pyrigaud.adapters.staging.registry import STAGING_TYPES, StagingPlace
from pyrigaud.adapters.staging.s3 import S3Staging
from pyrigaud.adapters.staging.s3_location import S3
from pyrigaud.domain.staging import StagedLocation, StagedSweep
from pyrigaud.entrypoints.grpc.wire.field_names import for_the_manager

from support import ok
from support.replica import Replica
from support.staging import (
    OWNER,
    S3_PART_BYTES,
    S3Server,
    StagingCase,
    killed_writer,
    nfs_options,
    s3_options,
    system_time,
)

pytestmark = pytest.mark.slow


def place_of(
    staging: StagingCase, request: pytest.FixtureRequest
) -> tuple[dict[str, object], dict[str, str]]:
    """The storage options a VMMigration names for this storage (S3: prefix `lab`, under which
    each migration has its folder), and the S3 credentials its Secret holds."""
    if staging.backend is S3:
        server = request.getfixturevalue("s3_server")
        secret = {"accessKeyID": server.access_key_id, "secretAccessKey": server.secret_access_key}
        return s3_options(server), secret
    return nfs_options(request.getfixturevalue("nfs_server")), {}


def mounted_secret(directory: Path, values: dict[str, str]) -> Path:
    directory.mkdir()
    for key, value in values.items():
        (directory / key).write_text(value)
    return directory


def abandoned_transfer(staging: StagingCase) -> StagedLocation:
    location = staging.locate("export.qcow2")
    killed_writer(staging, location)
    assert staging.leftovers() != [], "the killed writer left nothing to sweep"
    time.sleep(1.1)  # older than the sweeps' one second
    return location


def test_a_killed_transfer_in_a_migration_folder_is_swept_from_its_place(
    remote_staging: StagingCase, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    location = abandoned_transfer(remote_staging)
    options, secret = place_of(remote_staging, request)
    credentials = MountedSecretCredentials(mounted_secret(tmp_path / "secret", secret)).current
    unreadable = StagingPlace(S3, {"bucket": "elsewhere"}, dict)
    staging = STAGING_TYPES.stores(
        OWNER,
        clock=SystemClock(),
        pvc_root=str(tmp_path / "no-pvcs"),
        places=[unreadable, StagingPlace(remote_staging.backend, options, credentials)],
    )

    swept = staging.sweep_reachable(older_than_seconds=1.0)

    assert swept.removed >= 1
    assert remote_staging.leftovers() == []
    assert remote_staging.stored(location) is None
    # A place the sweep cannot look through is reported, and the others are still swept.
    assert [for_the_manager(failure) for failure in swept.failures] == [
        "credentials.accessKeyID: required for backend_type 's3'"
    ]


def test_a_provider_sweeps_its_configured_places_at_start_up(
    remote_staging: StagingCase, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    abandoned_transfer(remote_staging)
    options, secret = place_of(remote_staging, request)
    place: dict[str, object] = {
        "backendType": remote_staging.backend,
        "storageOptions": options,
    }
    if secret:
        place["credentialsDir"] = str(mounted_secret(tmp_path / "secret", secret))
    namespace, name = OWNER.split("/")
    survivor = Replica(
        {
            "PROVIDER_TYPE": "fake",  # the staging sweep is the same whatever the backend
            "PROVIDER_NAMESPACE": namespace,
            "PROVIDER_NAME": name,
            "PYRIGAUD_MIGRATION_STORAGE_ROOT": str(tmp_path / "no-pvcs"),
            "PYRIGAUD_TRANSFER_ABANDONED_AFTER_SECONDS": "1",
            "PYRIGAUD_STAGING_SWEEP_PLACES": json.dumps([place]),
        },
        tmp_path / "survivor",
    )
    try:
        assert survivor.logged("staged temporaries of dead transfers", 30)
        assert remote_staging.leftovers() == []
        log = survivor.log_path.read_text()
        assert "could not remove" not in log
        assert not secret or secret["secretAccessKey"] not in log
    finally:
        assert survivor.stop() == 0


def test_an_s3_place_is_swept_only_where_the_manager_stages(
    s3_server: S3Server, tmp_path: Path
) -> None:
    """Another upload of ours in the bucket, outside `<prefix>/vmmigrations/`, is not the
    place's to sweep (a shared bucket is never listed whole)."""
    adapter = S3Staging(owner=OWNER, part_bytes=S3_PART_BYTES, **system_time())
    credentials = {
        "accessKeyID": s3_server.access_key_id,
        "secretAccessKey": s3_server.secret_access_key,
    }
    elsewhere = ok(
        STAGING_TYPES.parse_location(
            "destination_url",
            f"s3://{s3_server.bucket}/lab/not-migrations/disk.qcow2",
            S3,
            s3_options(s3_server),
            credentials,
        )
    )
    writer = ok(adapter.open_write(elsewhere))
    ok(writer.write(bytes(S3_PART_BYTES + 1)))  # a part sent: an upload in progress
    time.sleep(1.1)
    place = StagingPlace(S3, s3_options(s3_server), lambda: credentials)
    staging = STAGING_TYPES.stores(OWNER, SystemClock(), str(tmp_path / "no-pvcs"), [place])
    try:
        assert staging.sweep_reachable(older_than_seconds=1.0) == StagedSweep()
        uploads = s3_server.client().list_multipart_uploads(Bucket=s3_server.bucket)
        assert [u["Key"] for u in uploads.get("Uploads", [])] == [elsewhere.key]
    finally:
        ok(writer.abort())
