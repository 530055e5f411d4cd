"""What only NFS has: the URL's uid/gid as the AUTH_SYS identity, and a server to reach."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pyrigaud.adapters.staging.nfs import NfsStaging
from pyrigaud.adapters.staging.nfs_location import NFS
from pyrigaud.adapters.staging.registry import STAGING_TYPES
from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.staging import StagedLocation

from support import error_of, ok
from support.staging import NfsServer, nfs_options, system_time

pytestmark = pytest.mark.slow
OWNER_ID = 1000


@pytest.fixture
def owned_folder(nfs_server: NfsServer, tmp_path: Path) -> Path:
    """A folder on the export that only uid/gid 1000 may write (`path` in the options)."""
    folder = nfs_server.export / f"owned-{tmp_path.name}"
    folder.mkdir(mode=0o755)
    os.chown(folder, OWNER_ID, OWNER_ID)
    return folder


def locate(server: NfsServer, key: str, query: str = "", host: str | None = None) -> StagedLocation:
    url = f"nfs://{host or server.server}{server.export}/{key}{query}"
    options = nfs_options(server) | ({"server": host} if host else {})
    return ok(STAGING_TYPES.parse_location("destination_url", url, NFS, options, {}))


def test_files_are_written_as_the_urls_uid_and_gid(
    nfs_server: NfsServer, owned_folder: Path
) -> None:
    location = locate(nfs_server, f"{owned_folder.name}/x.qcow2", "?gid=1000&uid=1000")
    writer = ok(NfsStaging(**system_time()).open_write(location))
    ok(writer.write(b"qcow2 bytes"))
    ok(writer.commit())
    facts = (owned_folder / "x.qcow2").stat()
    assert (facts.st_uid, facts.st_gid) == (OWNER_ID, OWNER_ID)
    reader = ok(NfsStaging(**system_time()).open_read(location))
    assert ok(reader.read_chunk()) == b"qcow2 bytes"
    reader.close()


def test_an_identity_the_server_refuses_is_permission_denied(
    nfs_server: NfsServer, owned_folder: Path
) -> None:
    location = locate(nfs_server, f"{owned_folder.name}/x.qcow2", "?gid=2000&uid=2000")
    error = error_of(NfsStaging(**system_time()).open_write(location))
    assert error.kind is ErrorKind.PERMISSION_DENIED
    assert "uid 2000" in error.message
    assert list(owned_folder.iterdir()) == []


def test_an_unreachable_server_is_unavailable(nfs_server: NfsServer) -> None:
    # Another loopback address: nothing serves NFS there (the server binds 127.0.0.1 only).
    location = locate(nfs_server, "x.qcow2", host="127.0.0.3")
    for result in (
        NfsStaging(retry_seconds=0, **system_time()).open_write(location),
        NfsStaging(retry_seconds=0, **system_time()).open_read(location),
        NfsStaging(retry_seconds=0, **system_time()).sweep(location, 0),
    ):
        assert error_of(result).kind is ErrorKind.UNAVAILABLE
