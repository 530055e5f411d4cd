"""The staging contract, the same for a PVC, an S3 bucket and an NFS export on real servers."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from returns.result import Success

from pyrigaud.application.ports.staging import StagedReader, StagedWriter
from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.staging import StagedLocation

from support import error_of, ok
from support.staging import (
    ADAPTER_AND_LOCATION,
    CHUNK_BYTES,
    MiB,
    StagingCase,
    describe_case,
    killed_writer,
    migration_name,
    pvc_case,
)

pytestmark = pytest.mark.slow
STREAMED_MIB = 160
MEMORY_BUDGET_MIB = 32  # parts (S3: 5 MiB) and chunks, never the object


def payload(size: int, seed: str = "disk") -> bytes:
    """Incompressible, reproducible bytes (a counter through SHA-256)."""
    blocks = (hashlib.sha256(f"{seed}{n}".encode()).digest() for n in range(size // 32 + 1))
    return b"".join(blocks)[:size]


def write_all(writer: StagedWriter, data: bytes, chunk: int = 1 * MiB) -> None:
    for start in range(0, len(data), chunk):
        ok(writer.write(data[start : start + chunk]))


def read_all(reader: StagedReader) -> list[bytes]:
    chunks = []
    while chunk := ok(reader.read_chunk()):
        chunks.append(chunk)
    return chunks


def stage(staging: StagingCase, location: StagedLocation, data: bytes) -> None:
    writer = ok(staging.storage.open_write(location, len(data)))
    write_all(writer, data)
    ok(writer.commit())


def test_written_bytes_read_back_identical_with_their_sha256(staging: StagingCase) -> None:
    data = payload(12 * MiB + 12345)  # three S3 parts of 5 MiB, the last one short
    location = staging.locate("export.qcow2")
    writer = ok(staging.storage.open_write(location))  # size unknown: the harder plan
    write_all(writer, data)
    digest = ok(writer.commit())
    assert (digest.sha256, digest.size_bytes) == (hashlib.sha256(data).hexdigest(), len(data))
    assert staging.stored(location) == data
    reader = ok(staging.storage.open_read(location))
    try:
        assert reader.size_bytes == len(data)
        chunks = read_all(reader)
    finally:
        reader.close()
    assert max(len(chunk) for chunk in chunks) <= CHUNK_BYTES  # streamed in bounded chunks
    assert b"".join(chunks) == data
    assert reader.digest() == digest
    assert staging.leftovers() == []


def test_a_commit_replaces_the_object_whole(staging: StagingCase) -> None:
    location = staging.locate("export.qcow2")
    stage(staging, location, payload(3 * MiB, "first"))
    stage(staging, location, payload(1 * MiB, "second"))
    assert staging.stored(location) == payload(1 * MiB, "second")


def test_an_empty_object_is_staged_and_read(staging: StagingCase) -> None:
    location = staging.locate("empty.raw")
    digest = ok(ok(staging.storage.open_write(location, 0)).commit())
    assert digest.sha256 == hashlib.sha256(b"").hexdigest()
    assert staging.stored(location) == b""
    reader = ok(staging.storage.open_read(location))
    assert ok(reader.read_chunk()) == b""
    reader.close()


def test_abort_leaves_nothing(staging: StagingCase) -> None:
    location = staging.locate("export.qcow2")
    writer = ok(staging.storage.open_write(location))
    write_all(writer, payload(11 * MiB))  # two S3 parts uploaded already
    assert staging.leftovers() != []  # the temporary (or the upload) exists while writing
    ok(writer.abort())
    assert staging.stored(location) is None
    assert staging.leftovers() == []
    assert isinstance(writer.abort(), Success)  # a second abort is a no-op
    with pytest.raises(RuntimeError, match="after it was finished"):  # a caller's bug
        writer.write(b"late")


def test_an_unfinished_write_leaves_the_old_object_in_place(staging: StagingCase) -> None:
    location = staging.locate("export.qcow2")
    stage(staging, location, payload(2 * MiB, "old"))
    writer = ok(staging.storage.open_write(location))
    write_all(writer, payload(11 * MiB, "new"))
    assert staging.stored(location) == payload(2 * MiB, "old")  # never a partial new one
    ok(writer.abort())
    assert staging.stored(location) == payload(2 * MiB, "old")


def test_memory_stays_bounded_while_staging_and_reading_back(staging: StagingCase) -> None:
    location = staging.locate("large.raw")
    probe = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE, str(STREAMED_MIB)],
        input=describe_case(staging, location).encode(),
        capture_output=True,
        check=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    growth_mib = json.loads(probe.stdout)["growth_mib"]
    assert growth_mib < MEMORY_BUDGET_MIB, f"{STREAMED_MIB} MiB moved, RSS grew {growth_mib} MiB"
    assert staging.leftovers() == []


def test_a_writer_killed_mid_write_leaves_only_what_the_sweep_removes(
    staging: StagingCase,
) -> None:
    location = staging.locate("export.qcow2")
    killed_writer(staging, location)
    assert staging.stored(location) is None  # nothing half-written under the final name
    assert staging.leftovers() != []
    time.sleep(1.1)
    assert ok(staging.storage.sweep(location, older_than_seconds=1.0)) >= 1
    assert staging.leftovers() == []


def test_the_sweep_removes_stale_temporaries_and_keeps_fresh_ones(staging: StagingCase) -> None:
    stale_location, fresh_location = staging.locate("a.qcow2"), staging.locate("b.qcow2")
    stale = ok(staging.storage.open_write(stale_location))
    write_all(stale, payload(6 * MiB))  # abandoned, as by a crash
    time.sleep(2.2)
    fresh = ok(staging.storage.open_write(fresh_location))
    write_all(fresh, payload(6 * MiB))
    before = staging.leftovers()
    assert ok(staging.storage.sweep(stale_location, older_than_seconds=2.0)) == 1
    after = staging.leftovers()
    assert len(after) == len(before) / 2  # one temporary (S3: upload and marker) of two
    assert all("b.qcow2" in leftover for leftover in after)
    ok(fresh.commit())  # the fresh writer was left alone and still completes
    assert staging.stored(fresh_location) == payload(6 * MiB)
    assert isinstance(stale.abort(), Success)  # swept already: abort has nothing left to do
    assert staging.leftovers() == []


def test_a_file_written_out_of_order_is_committed_whole_with_its_sha256(
    staging: StagingCase,
) -> None:
    """Where the store keeps local files (a PVC), an image whose tables come last is made in
    the object's own temporary and hashed as it stands at commit; S3 and NFS have no such
    file here (an export makes it in scratch and writes it with open_write)."""
    location = staging.locate("export.qcow2")
    stage(staging, location, payload(2 * MiB, "old"))
    staged = ok(staging.storage.open_file(location))
    if staging.backend != "pvc":
        assert staged is None
        return
    assert staged is not None
    data = payload(9 * MiB + 777)
    staged.file.seek(MiB)
    staged.file.write(data[MiB:])  # the data first, the first MiB (its tables) last
    assert staging.stored(location) == payload(2 * MiB, "old")  # never a partial new one
    staged.file.seek(0)
    staged.file.write(data[:MiB])
    digest = ok(staged.commit())
    assert (digest.sha256, digest.size_bytes) == (hashlib.sha256(data).hexdigest(), len(data))
    assert staging.stored(location) == data
    assert staging.leftovers() == []


def test_a_file_aborted_leaves_the_old_object_and_nothing_else(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    pvc = pvc_case(tmp_path / "migration-storage", migration_name(request))
    location = pvc.locate("export.qcow2")
    stage(pvc, location, payload(2 * MiB, "old"))
    staged = ok(pvc.storage.open_file(location))
    assert staged is not None
    staged.file.write(payload(3 * MiB))
    assert pvc.leftovers() != []
    ok(staged.abort())
    assert isinstance(staged.abort(), Success)  # a second abort is a no-op
    assert pvc.stored(location) == payload(2 * MiB, "old")
    assert pvc.leftovers() == []


def test_a_missing_object_is_not_found(staging: StagingCase) -> None:
    result = staging.storage.open_read(staging.locate("never-written.qcow2"))
    assert error_of(result).kind is ErrorKind.NOT_FOUND


def test_another_providers_temporaries_are_not_ours_to_sweep(file_staging: StagingCase) -> None:
    location = file_staging.locate("export.qcow2")
    theirs = ok(file_staging.adapter_for_owner("tests/other-provider").open_write(location))
    write_all(theirs, payload(1 * MiB))
    time.sleep(1.1)
    assert ok(file_staging.storage.sweep(location, older_than_seconds=1.0)) == 0
    assert len(file_staging.leftovers()) == 1
    ok(theirs.abort())
    assert file_staging.leftovers() == []


MEMORY_PROBE = (
    ADAPTER_AND_LOCATION
    + """
import resource
mebibytes = int(sys.argv[1])
chunk = bytes(range(256)) * 4096

def round_trip(count):
    writer = adapter.open_write(location).unwrap()
    for _ in range(count):
        writer.write(chunk).unwrap()
    written = writer.commit().unwrap()
    reader = adapter.open_read(location).unwrap()
    while reader.read_chunk().unwrap():
        pass
    reader.close()
    assert reader.digest() == written, (reader.digest(), written)

round_trip(12)  # libraries loaded, connections made, first parts sent
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
round_trip(mebibytes)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"growth_mib": (after - before) / 1024}))
"""
)
