"""What only S3 has: multipart uploads, retried parts, refused credentials, its endpoints."""

from __future__ import annotations

import hashlib
import random
import threading

import pytest
from returns.result import Failure, Result, Success

from pyrigaud.adapters.staging.registry import STAGING_TYPES
from pyrigaud.adapters.staging.s3 import S3Staging
from pyrigaud.adapters.staging.s3_location import S3
from pyrigaud.adapters.staging.s3_upload import PARTS_IN_FLIGHT
from pyrigaud.domain.errors import ErrorKind, ProviderError
from pyrigaud.domain.staging import StagedLocation

from support import error_of, ok
from support.ports import free_port
from support.staging import (
    S3_PART_BYTES,
    MiB,
    S3Server,
    flaky_proxy,
    s3_credentials,
    s3_options,
    system_time,
)

pytestmark = pytest.mark.slow


def locate(
    server: S3Server, name: str, endpoint: str | None = None, **credential_values: str
) -> StagedLocation:
    credentials = {**s3_credentials(server), **credential_values}
    url = f"s3://{server.bucket}/lab/vmmigrations/ns/s3-only/{name}"
    options = s3_options(server, endpoint)
    return ok(STAGING_TYPES.parse_location("destination_url", url, S3, options, credentials))


def adapter(retry_seconds: float = 30.0) -> S3Staging:
    return S3Staging(part_bytes=S3_PART_BYTES, retry_seconds=retry_seconds, **system_time())


def uploads_and_markers(server: S3Server) -> list[str]:
    client = server.client()
    folder = "lab/vmmigrations/ns/s3-only/"
    uploads = client.list_multipart_uploads(Bucket=server.bucket, Prefix=folder)
    objects = client.list_objects_v2(Bucket=server.bucket, Prefix=f"{folder}.")
    return [upload["Key"] for upload in uploads.get("Uploads", [])] + [
        entry["Key"] for entry in objects.get("Contents", [])
    ]


def stored(server: S3Server, location: StagedLocation) -> bool:
    listed = server.client().list_objects_v2(Bucket=server.bucket, Prefix=location.key)
    count: int = listed.get("KeyCount", 0)
    return count > 0


def part_threads() -> list[threading.Thread]:
    """The threads S3 writers upload their parts on, still alive."""
    return [thread for thread in threading.enumerate() if thread.name.startswith("s3-part")]


def test_a_known_size_is_uploaded_in_parts(s3_server: S3Server) -> None:
    data = bytes(range(256)) * (12 * MiB // 256)
    location = locate(s3_server, "known.qcow2")
    writer = ok(adapter().open_write(location, len(data)))
    for start in range(0, len(data), MiB):
        ok(writer.write(data[start : start + MiB]))
    assert ok(writer.commit()).sha256 == hashlib.sha256(data).hexdigest()
    head = s3_server.client().head_object(Bucket=s3_server.bucket, Key=location.key)
    assert head["ETag"].strip('"').endswith("-3")  # a multipart object of three parts
    assert uploads_and_markers(s3_server) == []


def test_a_part_refused_once_is_sent_again(s3_server: S3Server) -> None:
    data = bytes(12 * MiB)
    with flaky_proxy(s3_server.endpoint) as proxy:
        proxy.failures_left = 1
        location = locate(s3_server, "retried.qcow2", endpoint=proxy.endpoint)
        writer = ok(adapter().open_write(location))
        ok(writer.write(data))
        ok(writer.commit())
        assert proxy.refused == 1
    body = s3_server.client().get_object(Bucket=s3_server.bucket, Key=location.key)["Body"]
    assert body.read() == data
    assert uploads_and_markers(s3_server) == []


def test_a_part_refused_every_time_aborts_the_upload_at_the_commit(s3_server: S3Server) -> None:
    with flaky_proxy(s3_server.endpoint) as proxy:
        proxy.failures_left = -1
        location = locate(s3_server, "refused.qcow2", endpoint=proxy.endpoint)
        writer = ok(adapter(retry_seconds=1).open_write(location))
        ok(writer.write(bytes(S3_PART_BYTES)))  # handed to an upload thread
        failure = error_of(writer.commit())
        assert failure.kind is ErrorKind.UNAVAILABLE
        assert proxy.refused >= 2  # tried again while the budget lasted
    assert uploads_and_markers(s3_server) == []  # no orphaned upload, no marker
    assert not stored(s3_server, location)
    assert part_threads() == []


def test_a_part_refused_in_the_background_fails_a_later_write(s3_server: S3Server) -> None:
    with flaky_proxy(s3_server.endpoint) as proxy:
        proxy.failures_left = -1
        location = locate(s3_server, "refused-later.qcow2", endpoint=proxy.endpoint)
        writer = ok(adapter(retry_seconds=1).open_write(location))
        # The write that finds no room for one more part in flight waits for the oldest,
        # so the failure surfaces by then at the latest.
        results: list[Result[None, ProviderError]] = []
        for _ in range(PARTS_IN_FLIGHT + 2):
            results.append(writer.write(bytes(S3_PART_BYTES)))
            if isinstance(results[-1], Failure):
                break
    failed = len(results) - 1
    assert failed <= PARTS_IN_FLIGHT
    assert all(isinstance(result, Success) for result in results[:failed])
    assert error_of(results[failed]).kind is ErrorKind.UNAVAILABLE
    with pytest.raises(RuntimeError, match="after it was finished"):  # the writer was aborted
        writer.write(b"late")
    assert uploads_and_markers(s3_server) == []
    assert not stored(s3_server, location)
    assert part_threads() == []


def test_parts_round_trip_byte_exact_whatever_the_chunk_sizes(s3_server: S3Server) -> None:
    data = random.Random(7).randbytes(4 * S3_PART_BYTES + 123_457)
    for name, size in (("exact.raw", len(data)), ("unsized.raw", None)):
        location = locate(s3_server, name)
        writer = ok(adapter().open_write(location, size))
        start, step = 0, 1
        while start < len(data):  # chunks of odd sizes, straddling the parts' edges
            step = step * 7 % 3_000_017 + 1
            ok(writer.write(data[start : start + step]))
            start += step
        assert ok(writer.commit()).sha256 == hashlib.sha256(data).hexdigest()
        answer = s3_server.client().get_object(Bucket=s3_server.bucket, Key=location.key)
        assert answer["ETag"].strip('"').endswith("-5")  # four whole parts and a short one
        assert answer["Body"].read() == data
    assert uploads_and_markers(s3_server) == []


def test_the_upload_threads_end_with_the_commit_and_the_abort(s3_server: S3Server) -> None:
    for name, finish in (("committed.raw", "commit"), ("aborted.raw", "abort")):
        location = locate(s3_server, name)
        writer = ok(adapter().open_write(location))
        ok(writer.write(bytes(2 * S3_PART_BYTES)))
        assert part_threads() != []
        ok(writer.commit() if finish == "commit" else writer.abort())
        assert part_threads() == []
        assert stored(s3_server, location) == (finish == "commit")
    assert uploads_and_markers(s3_server) == []


def test_a_download_cut_half_way_resumes_where_it_stopped(s3_server: S3Server) -> None:
    data = bytes(range(256)) * (6 * MiB // 256)
    location = locate(s3_server, "resumed.qcow2")
    writer = ok(adapter().open_write(location))
    ok(writer.write(data))
    written = ok(writer.commit())
    with flaky_proxy(s3_server.endpoint) as proxy:
        proxy.cuts_left = 1
        reader = ok(adapter().open_read(locate(s3_server, "resumed.qcow2", proxy.endpoint)))
        chunks = []
        while chunk := ok(reader.read_chunk()):
            chunks.append(chunk)
        reader.close()
        assert proxy.ranges[0] == ""
        assert proxy.ranges[1].startswith("bytes=")  # resumed, not started again
        assert proxy.ranges[1] != "bytes=0-"
    assert b"".join(chunks) == data
    assert reader.digest() == written


def test_a_wrong_secret_is_permission_denied_and_never_echoed(s3_server: S3Server) -> None:
    secret = "not-the-secret-0123456789abcdefghijklmn"
    location = locate(s3_server, "denied.qcow2", secretAccessKey=secret)
    writer = ok(adapter().open_write(location))  # nothing is sent before the first part
    for result in (
        writer.write(bytes(6 * MiB)),
        ok(adapter().open_write(location)).commit(),
        adapter().open_read(location),
        adapter().sweep(location, 0),
    ):
        error = error_of(result)
        assert error.kind is ErrorKind.PERMISSION_DENIED
        assert secret not in error.message
        assert s3_server.secret_access_key not in error.message
        assert "denied.qcow2" in error.message


def test_session_credentials_work_and_a_wrong_token_is_permission_denied(
    s3_server: S3Server,
) -> None:
    granted = s3_server.temporary_credentials()
    location = locate(s3_server, "session.qcow2", **granted)
    writer = ok(adapter().open_write(location))
    ok(writer.write(b"staged with a session token"))
    ok(writer.commit())
    wrong = locate(s3_server, "session.qcow2", **{**granted, "sessionToken": "not-the-token"})
    error = error_of(adapter().open_read(wrong))
    assert error.kind is ErrorKind.PERMISSION_DENIED
    assert granted["sessionToken"] not in error.message
    assert granted["secretAccessKey"] not in error.message


def test_an_unknown_access_key_is_permission_denied(s3_server: S3Server) -> None:
    location = locate(s3_server, "x.qcow2", accessKeyID="AKIANOSUCHKEY")
    assert error_of(adapter().open_read(location)).kind is ErrorKind.PERMISSION_DENIED


def test_an_unreachable_endpoint_is_unavailable(s3_server: S3Server) -> None:
    location = locate(s3_server, "x.qcow2", endpoint=f"http://127.0.0.1:{free_port()}")
    for result in (
        ok(adapter(retry_seconds=0).open_write(location)).commit(),
        adapter(retry_seconds=0).open_read(location),
        adapter(retry_seconds=0).sweep(location, 0),
    ):
        error = error_of(result)
        assert error.kind is ErrorKind.UNAVAILABLE
        assert s3_server.secret_access_key not in error.message


def test_a_missing_bucket_is_not_found(s3_server: S3Server) -> None:
    url = "s3://absent-bucket/lab/x.qcow2"
    options = {**s3_options(s3_server), "bucket": "absent-bucket"}
    location = ok(
        STAGING_TYPES.parse_location("source_url", url, S3, options, s3_credentials(s3_server))
    )
    for result in (ok(adapter().open_write(location)).commit(), adapter().open_read(location)):
        error = error_of(result)
        assert error.kind is ErrorKind.NOT_FOUND
        assert "absent-bucket" in error.message
