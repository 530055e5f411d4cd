"""Staged objects in an S3 bucket, through boto3.

Why boto3 and not minio-py: boto3 exposes the multipart calls themselves (Create, UploadPart,
Complete, Abort, ListMultipartUploads) as public API, so this module owns the bounded part
buffer, the part size and the abort on every failure path; minio-py keeps those calls private
and decides part sizes itself. It is AWS's own, well-kept client, and boto3-stubs types it for
mypy.

Retries are this module's, not botocore's (its client makes one attempt per call): botocore's
"standard" mode retries a call on connection errors, timeouts, 5xx and throttling, but with
jittered backoff of up to 20 s per retry and a retry quota that runs dry in a long outage, so
how long a call may take is not bounded by anything a transfer can state; and it never
retries the reading of a streamed body. Here every call of a transfer (each part, each read
of the object, the create and the complete) is tried again for up to the staging retry
budget (`Patience`); a part's body is still in its buffer, so a retry resends it whole; a
download cut mid-way resumes with a ranged GET from the first byte not yet delivered.

A writer uploads up to PARTS_IN_FLIGHT parts on threads of its own while the caller fills the
next, so reading the source overlaps sending to S3. It holds at most PARTS_IN_FLIGHT + 1 part
buffers in memory (of the part size: 8 MiB for objects up to 80 GiB), made once and reused.
With a known size the part size is the smallest that fits the object in S3's 10,000 parts
(never under PART_BYTES); with an unknown size it doubles every 1,000 parts, so any object S3
accepts (5 TiB) fits. An object smaller than one part is one PutObject. Nothing appears under
the final key before CompleteMultipartUpload, parts are completed in order, and any failure
(a part's, on its thread, is raised by the next write or the commit) aborts the upload once
the parts in flight have ended; commit and abort stop the writer's threads. When the store is
what failed, the abort is deferred (`DeferredAborts`): tried in the background until the store
answers again, so the RPC answers at once and no upload waits for the sweep.

S3 lists uploads in progress without their metadata (and S3 servers such as moto do not even
report their start), so each upload gets a marker object beside its key, named like the other
backends' temporaries (owner mark, start time) and holding the upload's id; commit and abort
remove it, and the sweep aborts the upload of every stale marker of ours, then the marker.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar, cast

from botocore.exceptions import BotoCoreError, ClientError
from returns.result import Result

from pyrigaud.adapters.clocks import SystemClock
from pyrigaud.adapters.staging.deferred_aborts import DeferredAborts
from pyrigaud.adapters.staging.patience import STAGING_RETRY_SECONDS, Patience
from pyrigaud.adapters.staging.streams import CHUNK_BYTES, RunningDigest, TemporaryWriter, as_result
from pyrigaud.application.ports.clock import Clock
from pyrigaud.domain.errors import ErrorKind, ExpectedError, ProviderError
from pyrigaud.domain.staging import StagedDigest, StagedLocation
from pyrigaud.domain.staging_names import temporary_name, temporary_started_at

if TYPE_CHECKING:
    from botocore.response import StreamingBody
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef, GetObjectOutputTypeDef

MiB = 1024 * 1024
PART_BYTES = 8 * MiB  # S3's floor is 5 MiB for every part but the last
MAX_PART_BYTES = 5 * 1024 * MiB
MAX_PARTS = 10_000
PARTS_PER_DOUBLING = 1_000
PARTS_IN_FLIGHT = 2  # uploading while the next part fills: reading overlaps sending
MAX_OBJECT_BYTES = 5 * 1024 * 1024 * MiB
DENIED_CODES = frozenset(
    {
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
    }
)
MISSING_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "NoSuchUpload", "NotFound", "404"})
T = TypeVar("T")


@dataclass(frozen=True)
class S3Staging:
    """S3 staging; a client per opened object, configured from that request's options."""

    owner: str = "pyrigaud"
    clock: Clock = field(default_factory=SystemClock)
    chunk_bytes: int = CHUNK_BYTES
    part_bytes: int = PART_BYTES
    retry_seconds: float = STAGING_RETRY_SECONDS  # per part or read (module docstring)
    connect_timeout_seconds: float = 10.0
    read_timeout_seconds: float = 60.0
    # Where aborts the store did not answer wait (shared by a provider's adapters).
    aborts: DeferredAborts = field(
        default_factory=lambda: DeferredAborts(SystemClock()), compare=False, repr=False
    )

    def open_read(self, location: StagedLocation) -> Result[S3Reader, ProviderError]:
        def opened() -> S3Reader:
            client = self._client(location)
            patience = Patience(self.clock, self.retry_seconds)
            answer = patience.retried(
                f"read {location.url}",
                lambda: _calling(
                    location,
                    "read",
                    lambda: client.get_object(Bucket=location.container, Key=location.key),
                ),
            )
            return S3Reader(client, answer, location, self.chunk_bytes, patience)

        return as_result(opened)

    def open_write(
        self, location: StagedLocation, size_bytes: int | None = None
    ) -> Result[S3Writer, ProviderError]:
        def opened() -> S3Writer:
            if size_bytes is not None and size_bytes > MAX_OBJECT_BYTES:
                raise ExpectedError(
                    ProviderError.resource_exhausted(
                        f"{location.url}: {size_bytes} bytes is more than S3 stores in one object"
                    )
                )
            # No HeadBucket first: it needs s3:ListBucket, which a writer does not otherwise
            # need; a refusal or a missing bucket shows at the first part or the commit.
            client = self._client(location)
            marker = _sibling(
                location,
                temporary_name(location.name, self.owner, self.clock.now(), secrets.token_hex(4)),
            )
            return S3Writer(
                client,
                location,
                part_plan(size_bytes, self.part_bytes),
                marker,
                patience=Patience(self.clock, self.retry_seconds),
                aborts=self.aborts,
            )

        return as_result(opened)

    def sweep(
        self, location: StagedLocation, older_than_seconds: float
    ) -> Result[int, ProviderError]:
        """Abort the uploads of this provider's stale markers in the location's folder and
        the folders below it (a staging place's prefix holds one folder per migration)."""

        def swept() -> int:
            client = self._client(location)
            deadline = self.clock.now() - older_than_seconds
            pages = client.get_paginator("list_objects_v2").paginate(
                Bucket=location.container, Prefix=_sibling(location, "")
            )
            removed = 0
            for page in _calling(location, "sweep", lambda: list(pages)):
                for entry in page.get("Contents", []):
                    started = temporary_started_at(entry["Key"].rsplit("/", 1)[-1], self.owner)
                    if started is not None and started <= deadline:
                        _remove_marked_upload(client, location, entry["Key"])
                        removed += 1
            return removed

        return as_result(swept)

    def _client(self, location: StagedLocation) -> S3Client:
        # Imported here, at the first S3 transfer: boto3 and its configuration take ~9 MiB a
        # provider that never stages to S3 should not hold.
        import boto3  # noqa: PLC0415
        from botocore.config import Config  # noqa: PLC0415

        from pyrigaud.adapters.staging.pinned_http import pin_to_address  # noqa: PLC0415

        credentials = location.credentials
        if credentials is None:  # parse_staged_location always sets them for s3
            raise ExpectedError(ProviderError.invalid_spec("credentials", "required for s3"))
        options = location.options
        pinned = bool(location.address and options.endpoint)
        config = Config(
            region_name=options.region,
            signature_version="s3v4",
            # A pinned client reaches one checked host: the bucket goes in the path.
            s3={"addressing_style": "path" if options.use_path_style or pinned else "virtual"},
            retries={"mode": "standard", "total_max_attempts": 1},  # Patience retries
            connect_timeout=self.connect_timeout_seconds,
            read_timeout=self.read_timeout_seconds,
            # S3-compatible servers do not all know the newer checksums; SHA-256 is ours.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        token = credentials.session_token
        client = boto3.session.Session().client(
            "s3",
            endpoint_url=options.endpoint or None,
            aws_access_key_id=credentials.access_key_id,
            aws_secret_access_key=credentials.secret_access_key.get_secret_value(),
            aws_session_token=token.get_secret_value() if token else None,
            config=config,
        )
        if pinned:
            pin_to_address(
                client,
                options.endpoint,
                location.address,
                connect_seconds=self.connect_timeout_seconds,
                read_seconds=self.read_timeout_seconds,
            )
        return client


@dataclass(frozen=True)
class PartPlan:
    """The size of each part of one upload."""

    first_part_bytes: int
    grows: bool  # the size is unknown: double every PARTS_PER_DOUBLING parts

    def part_bytes(self, part_number: int) -> int:
        if not self.grows:
            return self.first_part_bytes
        doublings = (part_number - 1) // PARTS_PER_DOUBLING
        return min(self.first_part_bytes << doublings, MAX_PART_BYTES)


def part_plan(size_bytes: int | None, floor_bytes: int) -> PartPlan:
    """Whole MiB parts, never under `floor_bytes`, enough for `size_bytes` in MAX_PARTS."""
    if size_bytes is None:
        return PartPlan(floor_bytes, grows=True)
    needed = math.ceil(math.ceil(size_bytes / MAX_PARTS) / MiB) * MiB
    return PartPlan(min(max(floor_bytes, needed), MAX_PART_BYTES), grows=False)


class S3Reader:
    """The object's bytes in chunks. A download cut mid-way resumes, within the retry budget,
    with a ranged GET of the same ETag from the first byte not yet delivered: the caller
    never sees a byte twice or misses one, so the digest is of the object."""

    def __init__(
        self,
        client: S3Client,
        answer: GetObjectOutputTypeDef,
        location: StagedLocation,
        chunk_bytes: int,
        patience: Patience,
    ) -> None:
        self._client = client
        self._body: StreamingBody | None = answer["Body"]
        self._etag = answer["ETag"]
        self._location = location
        self._chunk_bytes = chunk_bytes
        self._patience = patience
        self._delivered = 0
        self._digest = RunningDigest()
        self.size_bytes: int | None = answer["ContentLength"]

    def read_chunk(self) -> Result[bytes, ProviderError]:
        def read() -> bytes:
            chunk = self._patience.retried(
                f"read {self._location.url} from byte {self._delivered}",
                lambda: _calling(self._location, "read", self._next_chunk),
                after_failure=self._drop_body,
            )
            self._delivered += len(chunk)
            self._digest.add(chunk)
            return chunk

        return as_result(read)

    def _next_chunk(self) -> bytes:
        body = self._body
        if body is None:  # a failed read dropped it: resume after the delivered bytes
            if self.size_bytes is not None and self._delivered >= self.size_bytes:
                return b""
            body = self._body = self._client.get_object(
                Bucket=self._location.container,
                Key=self._location.key,
                Range=f"bytes={self._delivered}-",
                IfMatch=self._etag,  # the same object, or PreconditionFailed
            )["Body"]
        return body.read(self._chunk_bytes)

    def _drop_body(self) -> None:
        if self._body is not None:
            body, self._body = self._body, None
            body.close()

    def digest(self) -> StagedDigest:
        return self._digest.value()

    def close(self) -> None:
        self._drop_body()


class S3Writer(TemporaryWriter):
    """Fills a part while up to PARTS_IN_FLIGHT earlier ones upload on the writer's own
    threads. A chunk is copied once, into its part's buffer; the buffers are made once and
    reused, so the process's heap does not churn 8 MiB blocks. Every call is retried within
    the budget; the first that runs out of it stops the other parts' retries."""

    def __init__(
        self,
        client: S3Client,
        location: StagedLocation,
        plan: PartPlan,
        marker: str,
        *,
        patience: Patience,
        aborts: DeferredAborts,
    ) -> None:
        super().__init__(location.url)
        self._client = client
        self._location = location
        self._plan = plan
        self._marker = marker
        self._patience = patience
        self._aborts = aborts
        self._given_up = threading.Event()  # a call found the store gone: no more retries
        self._filling: bytearray | None = None
        self._filled = 0
        self._spare: bytearray | None = None  # the buffer of the last part S3 acknowledged
        self._sent = 0  # parts handed to the upload threads
        self._upload_id: str | None = None
        self._uploads: ThreadPoolExecutor | None = None
        self._in_flight: deque[tuple[Future[CompletedPartTypeDef], bytearray]] = deque()
        self._parts: list[CompletedPartTypeDef] = []
        self._store_gone = False

    def _write(self, chunk: bytes) -> None:
        self._raise_failed_part()
        data = memoryview(chunk)
        while data:
            part = self._part_buffer()
            taken = min(len(data), len(part) - self._filled)
            part[self._filled : self._filled + taken] = data[:taken]
            self._filled += taken
            data = data[taken:]
            if self._filled == len(part):
                self._send_filled()

    def _commit(self) -> None:
        bucket, key = self._location.container, self._location.key
        if self._upload_id is None:
            body = _shrunk(self._filling, self._filled) if self._filling is not None else b""
            self._patient(
                "write", lambda: self._client.put_object(Bucket=bucket, Key=key, Body=body)
            )
            return
        if self._filled:
            self._send_filled()
        while self._in_flight:
            self._collect_oldest()
        self._stop_uploads()
        upload_id, parts = self._upload_id, self._parts
        try:
            self._patient(
                "write",
                lambda: self._client.complete_multipart_upload(
                    Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
                ),
            )
        except ExpectedError as error:
            # A complete whose answer was lost, tried again, finds no upload: it is done.
            if error.error.kind is not ErrorKind.NOT_FOUND or not self._stored_from_parts():
                raise
        marker = self._marker
        try:
            self._patient(
                "remove the marker of", lambda: _delete_marker(self._client, self._location, marker)
            )
        except ExpectedError as error:
            if error.error.kind is not ErrorKind.UNAVAILABLE:
                raise
            self._aborts.defer(
                f"the marker of {self.url}",
                lambda: _delete_marker(self._client, self._location, marker),
            )

    def _abort(self) -> None:
        # Parts still uploading end first: one that lands after the abort would stay stored.
        self._given_up.set()
        self._stop_uploads()
        self._in_flight.clear()
        self._filling = self._spare = None
        upload_id = self._upload_id
        if upload_id is None:
            return

        def remove() -> None:
            _remove_marked_upload(self._client, self._location, self._marker, upload_id)

        self._aborts.abort_or_defer(
            f"the multipart upload of {self.url}", remove, store_gone=self._store_gone
        )

    def _patient(self, action: str, call: Callable[[], T]) -> T:
        """`call`, tried again within the budget while the store is unavailable; once one call
        of this writer gives up, the others stop retrying and the abort is deferred."""
        try:
            return self._patience.retried(
                f"{action} {self.url}",
                lambda: _calling(self._location, action, call),
                stop=self._given_up,
            )
        except ExpectedError as error:
            if error.error.kind is ErrorKind.UNAVAILABLE:
                self._store_gone = True
                self._given_up.set()
            raise

    def _stored_from_parts(self) -> bool:
        """Whether the object under the key is the one these parts make (S3's multipart
        ETag: the MD5 of the parts' MD5s, and their count)."""
        digests = b"".join(bytes.fromhex(part["ETag"].strip('"')) for part in self._parts)
        made = f'"{hashlib.md5(digests, usedforsecurity=False).hexdigest()}-{len(self._parts)}"'
        try:
            head = self._patient(
                "write",
                lambda: self._client.head_object(
                    Bucket=self._location.container, Key=self._location.key
                ),
            )
        except ExpectedError as error:
            if error.error.kind is ErrorKind.NOT_FOUND:
                return False
            raise
        return head["ETag"] == made

    def _part_buffer(self) -> bytearray:
        """The part being filled: the spare buffer when it has this part's size."""
        if self._filling is None:
            size = self._plan.part_bytes(self._sent + 1)
            spare, self._spare = self._spare, None
            self._filling = spare if spare is not None and len(spare) == size else bytearray(size)
            self._filled = 0
        return self._filling

    def _send_filled(self) -> None:
        """Hand the filled part to an upload thread, once fewer than PARTS_IN_FLIGHT are."""
        part, filled = self._filling, self._filled
        assert part is not None  # a part is only sent once filled
        if self._upload_id is None:
            self._upload_id = self._start_upload()
            self._uploads = ThreadPoolExecutor(PARTS_IN_FLIGHT, thread_name_prefix="s3-part")
        number = self._sent + 1
        if number > MAX_PARTS:
            raise ExpectedError(
                ProviderError.resource_exhausted(f"{self.url}: more than {MAX_PARTS} parts")
            )
        if len(self._in_flight) == PARTS_IN_FLIGHT:
            self._collect_oldest()
        body = _shrunk(part, filled)
        assert self._uploads is not None  # made with the upload
        future = self._uploads.submit(self._sent_part, self._upload_id, number, body)
        self._in_flight.append((future, part))
        self._sent = number
        self._filling, self._filled = None, 0

    def _sent_part(self, upload_id: str, number: int, body: bytes) -> CompletedPartTypeDef:
        """Upload one part (on an upload thread), resent whole from its buffer if need be."""
        bucket, key = self._location.container, self._location.key
        answer = self._patient(
            f"write part {number} of",
            lambda: self._client.upload_part(
                Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body
            ),
        )
        return {"ETag": answer["ETag"], "PartNumber": number}

    def _collect_oldest(self) -> None:
        """Wait for the oldest part in flight: its failure is raised, its buffer is spare."""
        future, part = self._in_flight.popleft()
        self._parts.append(future.result())
        self._spare = part

    def _raise_failed_part(self) -> None:
        """A part that failed in the background fails the next write."""
        for future, _ in self._in_flight:
            if future.done() and future.exception() is not None:
                future.result()

    def _stop_uploads(self) -> None:
        """Wait for the upload threads to end; none is left behind."""
        if self._uploads is not None:
            self._uploads.shutdown(wait=True, cancel_futures=True)
            self._uploads = None

    def _start_upload(self) -> str:
        """A multipart upload, and its marker for the sweep (aborted if the marker fails)."""
        bucket, key = self._location.container, self._location.key
        started = self._patient(
            "write", lambda: self._client.create_multipart_upload(Bucket=bucket, Key=key)
        )
        upload_id = started["UploadId"]
        note = json.dumps({"key": key, "upload_id": upload_id}).encode()
        try:
            self._patient(
                "write",
                lambda: self._client.put_object(Bucket=bucket, Key=self._marker, Body=note),
            )
        except ExpectedError as error:
            if error.error.kind is not ErrorKind.UNAVAILABLE:
                _abort_upload(self._client, self._location, key, upload_id)
                raise
            self._aborts.defer(
                f"the multipart upload of {self.url}",
                lambda: _remove_marked_upload(
                    self._client, self._location, self._marker, upload_id
                ),
            )
            raise
        return upload_id


def _shrunk(part: bytearray, filled: int) -> bytes:
    """The part's first `filled` bytes as a body, without a copy: a short part is the last
    one, cut in place. botocore signs and urllib3 sends any bytes-like body as it is (the
    stubs say bytes only)."""
    if filled < len(part):
        del part[filled:]
    return cast(bytes, part)


def _sibling(location: StagedLocation, name: str) -> str:
    return f"{location.parent}/{name}" if location.parent else name


def _remove_marked_upload(
    client: S3Client, location: StagedLocation, marker: str, upload_id: str | None = None
) -> None:
    """Abort the upload a marker names (read from it unless given), then delete the marker."""
    if upload_id is None:

        def marker_note() -> bytes:
            return client.get_object(Bucket=location.container, Key=marker)["Body"].read()

        try:
            body = _calling(location, "sweep", marker_note)
        except ExpectedError as error:
            if error.error.kind is ErrorKind.NOT_FOUND:
                return  # swept by another replica
            raise
        note = json.loads(body)
        _abort_upload(client, location, str(note["key"]), str(note["upload_id"]))
    else:
        _abort_upload(client, location, location.key, upload_id)
    _delete_marker(client, location, marker)


def _delete_marker(client: S3Client, location: StagedLocation, marker: str) -> None:
    _calling(
        location,
        "remove the marker of",
        lambda: client.delete_object(Bucket=location.container, Key=marker),
    )


def _abort_upload(client: S3Client, location: StagedLocation, key: str, upload_id: str) -> None:
    try:
        _calling(
            location,
            "abort an upload to",
            lambda: client.abort_multipart_upload(
                Bucket=location.container, Key=key, UploadId=upload_id
            ),
        )
    except ExpectedError as error:
        if error.error.kind is not ErrorKind.NOT_FOUND:  # already gone: what abort wanted
            raise


def _calling(location: StagedLocation, action: str, call: Callable[[], T]) -> T:
    """`call`, with S3's answers turned into this provider's kinds (never echoing a secret)."""
    try:
        return call()
    except ClientError as error:
        raise _refusal(location, action, error) from None
    except BotoCoreError as error:
        where = location.options.endpoint or "AWS S3"
        raise ExpectedError(
            ProviderError.unavailable(
                f"cannot {action} {location.url}: {where} did not answer ({type(error).__name__})"
            )
        ) from None


def _refusal(location: StagedLocation, action: str, error: ClientError) -> ExpectedError:
    code = str(error.response.get("Error", {}).get("Code", ""))
    status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
    what = f"cannot {action} {location.url}"
    if code in DENIED_CODES or status == 403:
        return ExpectedError(
            ProviderError.permission_denied(
                f"{what}: S3 refused the credentials ({code or status}); check the secret "
                "named by credentialsSecretRef and its access to the bucket"
            )
        )
    if code == "NoSuchBucket":
        return ExpectedError(ProviderError.not_found(f"{what}: no bucket {location.container!r}"))
    if code in MISSING_CODES or status == 404:
        return ExpectedError(ProviderError.not_found(f"{what}: no such object"))
    if status >= 500 or status == 429 or code in ("SlowDown", "RequestTimeout"):
        return ExpectedError(ProviderError.unavailable(f"{what}: S3 answered {code or status}"))
    return ExpectedError(ProviderError.failed_precondition(f"{what}: S3 answered {code or status}"))
