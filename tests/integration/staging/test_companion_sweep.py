"""A hardware manifest staged beside a disk outlives it (the manager removes the disk after a
migration, never the manifest): the sweeps remove a manifest whose disk is gone, on a PVC, an
S3 bucket and an NFS export alike, and leave one whose disk is there or being written."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from pyrigaud.adapters.clocks import SystemClock
from pyrigaud.adapters.staging.nfs_location import NFS
from pyrigaud.adapters.staging.pvc_location import PVC
from pyrigaud.adapters.staging.registry import STAGING_TYPES, StagingPlace
from pyrigaud.adapters.staging.s3_location import S3
from pyrigaud.application.hardware_manifest import MANIFEST_SUFFIX
from pyrigaud.application.ports.staging import StagedWriter, StagingStorage
from pyrigaud.domain.staging import StagedLocation

from support import ok
from support.staging import OWNER, S3_PART_BYTES, StagingCase, nfs_options, s3_credentials
from support.staging import s3_options as s3_place_options

pytestmark = pytest.mark.slow
LONG_AGO_SECONDS = 3600.0  # no temporary of these tests is that old: none is stale


def with_companions(staging: StagingCase) -> StagingStorage:
    """The case's store, told of the manifest's suffix as the container tells it."""
    store: Any = staging.storage  # a store's settings are a dataclass's fields
    return dataclasses.replace(store, companion_suffixes=(MANIFEST_SUFFIX,))  # type: ignore[no-any-return]


def put(store: StagingStorage, location: StagedLocation, data: bytes) -> None:
    writer = ok(store.open_write(location, len(data)))
    ok(writer.write(data))
    ok(writer.commit())


def in_flight(store: StagingStorage, location: StagedLocation) -> StagedWriter:
    """A write of `location` under way: its temporary (S3: an upload with its marker, made at
    the first part sent) is there, its final name is not."""
    writer = ok(store.open_write(location))
    ok(writer.write(bytes(S3_PART_BYTES + 1)))
    return writer


class Folder:
    """A migration's folder: a manifest whose disk is gone, a disk with its manifest, a disk
    being written with its manifest (written first), and an object that is no one's manifest."""

    def __init__(self, staging: StagingCase, store: StagingStorage) -> None:
        self.staging = staging
        self.orphan = staging.locate("gone.qcow2").companion(MANIFEST_SUFFIX)
        self.disk = staging.locate("kept.qcow2")
        self.writing = staging.locate("writing.qcow2")
        self.other = staging.locate("notes.hardware")
        self.kept = {
            self.disk: b"disk",
            self.disk.companion(MANIFEST_SUFFIX): b"{}",
            self.writing.companion(MANIFEST_SUFFIX): b"{}",
            self.other: b"notes",
        }
        for location, data in {self.orphan: b"{}", **self.kept}.items():
            put(store, location, data)
        self.writer = in_flight(store, self.writing)

    def assert_swept(self) -> None:
        assert self.staging.stored(self.orphan) is None
        for location, data in self.kept.items():
            assert self.staging.stored(location) == data, location.key
        assert self.staging.leftovers() != []  # the write in flight keeps its temporary
        ok(self.writer.commit())  # and still completes
        assert self.staging.stored(self.writing) == bytes(S3_PART_BYTES + 1)
        assert self.staging.leftovers() == []


def test_a_transfers_sweep_removes_a_manifest_whose_disk_is_gone(staging: StagingCase) -> None:
    store = with_companions(staging)
    folder = Folder(staging, store)
    try:
        assert ok(store.sweep(folder.disk, LONG_AGO_SECONDS)) == 1
        folder.assert_swept()
    finally:
        folder.writer.abort()


def test_a_store_told_of_no_companion_removes_none(staging: StagingCase) -> None:
    store = with_companions(staging)
    folder = Folder(staging, store)
    try:
        assert ok(staging.storage.sweep(folder.disk, LONG_AGO_SECONDS)) == 0
        assert staging.stored(folder.orphan) == b"{}"
    finally:
        folder.writer.abort()
        ok(store.sweep(folder.disk, LONG_AGO_SECONDS))  # nothing left for another test's sweep


def test_the_periodic_sweep_removes_a_manifest_whose_disk_is_gone(
    staging: StagingCase, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Every mounted PVC, and each configured S3 or NFS place (shared by every test: other
    tests' manifests may be swept there too)."""
    folder = Folder(staging, with_companions(staging))
    places: list[StagingPlace] = []
    if staging.backend == S3:
        server = request.getfixturevalue("s3_server")
        credentials = s3_credentials(server)
        places.append(StagingPlace(S3, s3_place_options(server), lambda: credentials))
    elif staging.backend == NFS:
        places.append(StagingPlace(NFS, nfs_options(request.getfixturevalue("nfs_server"))))
    pvc_root = tmp_path / ("migration-storage" if staging.backend == PVC else "no-pvcs")
    stores = STAGING_TYPES.stores(
        OWNER, SystemClock(), str(pvc_root), places, companion_suffixes=(MANIFEST_SUFFIX,)
    )
    try:
        swept = stores.sweep_reachable(LONG_AGO_SECONDS)
        assert swept.failures == ()
        assert swept.removed >= 1
        folder.assert_swept()
    finally:
        folder.writer.abort()
