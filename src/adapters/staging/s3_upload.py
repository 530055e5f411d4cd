"""Objects written to S3 as multipart uploads, through boto3 (`s3.py` has the rest).

A writer uploads up to PARTS_IN_FLIGHT parts on threads of its own while the caller fills the
next, so reading the source overlaps sending to S3. It holds at most PARTS_IN_FLIGHT + 1 part
buffers in memory (of the part size: 8 MiB for objects up to 80 GiB), made once and reused.
With a known size the part size is the smallest that fits the object in S3's 10,000 parts
(never under PART_BYTES); with an unknown size it doubles every 1,000 parts, so any object S3
accepts (5 TiB) fits. An object smaller than one part is one PutObject. Nothing appears under
the final key before CompleteMultipartUpload, parts are completed in order, and any failure
(a part's, on its thread, is answered by the next write or the commit) aborts the upload once
the parts in flight have ended; commit and abort stop the writer's threads. When the store is
what failed, the abort is deferred (`DeferredAborts`): tried in the background until the store
answers again, so the RPC answers at once and no upload waits for the sweep.

A failed part is resent whole from its buffer, within the staging retry budget (`Patience`),
as `s3.py` says of every call.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, TypeVar, cast

from returns.result import Failure, Result, Success

from pyrigaud.adapters.staging.deferred_aborts import DeferredAborts
from pyrigaud.adapters.staging.patience import Patience
from pyrigaud.adapters.staging.s3_calls import (
    abort_upload,
    called,
    calling,
    delete_marker,
    remove_marked_upload,
)
from pyrigaud.adapters.staging.streams import TemporaryWriter
from pyrigaud.domain.errors import ErrorKind, ProviderError
from pyrigaud.domain.staging import StagedLocation

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import (
        CompletedPartTypeDef,
        HeadObjectOutputTypeDef,
        UploadPartOutputTypeDef,
    )

MiB = 1024 * 1024
T = TypeVar("T")
PART_BYTES = 8 * MiB  # S3's floor is 5 MiB for every part but the last
MAX_PART_BYTES = 5 * 1024 * MiB
MAX_PARTS = 10_000
PARTS_PER_DOUBLING = 1_000
PARTS_IN_FLIGHT = 2  # uploading while the next part fills: reading overlaps sending
MAX_OBJECT_BYTES = 5 * 1024 * 1024 * MiB


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
        self._in_flight: deque[
            tuple[Future[Result[CompletedPartTypeDef, ProviderError]], bytearray]
        ] = deque()
        self._parts: list[CompletedPartTypeDef] = []
        self._store_gone = False

    def _write(self, chunk: bytes) -> Result[None, ProviderError]:
        match self._failed_part():
            case Failure() as failed:
                return failed
        data = memoryview(chunk)
        while data:
            part = self._part_buffer()
            taken = min(len(data), len(part) - self._filled)
            part[self._filled : self._filled + taken] = data[:taken]
            self._filled += taken
            data = data[taken:]
            if self._filled == len(part):
                match self._send_filled():
                    case Failure() as failed:
                        return failed
        return Success(None)

    def _commit(self) -> Result[None, ProviderError]:
        bucket, key = self._location.container, self._location.key
        if self._upload_id is None:
            body = _shrunk(self._filling, self._filled) if self._filling is not None else b""
            return self._patient_call(
                "write", partial(self._client.put_object, Bucket=bucket, Key=key, Body=body)
            )
        if self._filled:
            match self._send_filled():
                case Failure() as failed:
                    return failed
        while self._in_flight:
            match self._collect_oldest():
                case Failure() as failed:
                    return failed
        self._stop_uploads()
        upload_id, parts = self._upload_id, self._parts
        completed = self._patient_call(
            "write",
            partial(
                self._client.complete_multipart_upload,
                Bucket=bucket,
                Key=key,
                UploadId=upload_id,
                MultipartUpload={"Parts": parts},
            ),
        )
        return Result.do(
            None for _ in completed.lash(self._completed_before) for _ in self._marker_removed()
        )

    def _completed_before(self, error: ProviderError) -> Result[None, ProviderError]:
        """A complete whose answer was lost, tried again, finds no upload: it is done."""
        if error.kind is not ErrorKind.NOT_FOUND:
            return Failure(error)
        match self._stored_from_parts():
            case Success(True):
                return Success(None)
            case Failure() as failed:
                return failed
        return Failure(error)

    def _marker_removed(self) -> Result[None, ProviderError]:
        """The committed upload's marker removed, or its removal deferred while S3 is gone."""
        marker = self._marker

        def delete() -> Result[None, ProviderError]:
            return delete_marker(self._client, self._location, marker)

        deleted = self._patient_step("remove the marker of", delete)
        match deleted:
            case Failure(error) if error.kind is ErrorKind.UNAVAILABLE:
                self._aborts.defer(f"the marker of {self.url}", delete)
                return Success(None)
        return deleted

    def _abort(self) -> Result[None, ProviderError]:
        # Parts still uploading end first: one that lands after the abort would stay stored.
        self._given_up.set()
        self._stop_uploads()
        self._in_flight.clear()
        self._filling = self._spare = None
        upload_id = self._upload_id
        if upload_id is None:
            return Success(None)
        return self._aborts.abort_or_defer(
            f"the multipart upload of {self.url}",
            partial(remove_marked_upload, self._client, self._location, self._marker, upload_id),
            store_gone=self._store_gone,
        )

    def _patient(self, action: str, call: Callable[[], T]) -> Result[T, ProviderError]:
        """The S3 call `call`, through `_patient_step`."""
        return self._patient_step(action, partial(calling, self._location, action, call))

    def _patient_call(self, action: str, call: Callable[[], object]) -> Result[None, ProviderError]:
        """`_patient` for a call whose answer is not needed."""
        return self._patient_step(action, partial(called, self._location, action, call))

    def _patient_step(
        self, action: str, step: Callable[[], Result[T, ProviderError]]
    ) -> Result[T, ProviderError]:
        """`step`, tried again within the budget while the store is unavailable; once one
        call of this writer gives up, the others stop retrying and the abort is deferred."""
        tried = self._patience.retried(f"{action} {self.url}", step, stop=self._given_up)
        match tried:
            case Failure(error) if error.kind is ErrorKind.UNAVAILABLE:
                self._store_gone = True
                self._given_up.set()
        return tried

    def _stored_from_parts(self) -> Result[bool, ProviderError]:
        """Whether the object under the key is the one these parts make (S3's multipart
        ETag: the MD5 of the parts' MD5s, and their count)."""
        digests = b"".join(bytes.fromhex(part["ETag"].strip('"')) for part in self._parts)
        made = f'"{hashlib.md5(digests, usedforsecurity=False).hexdigest()}-{len(self._parts)}"'

        def is_made_of_them(head: HeadObjectOutputTypeDef) -> bool:
            return head["ETag"] == made

        return (
            self._patient(
                "write",
                partial(
                    self._client.head_object,
                    Bucket=self._location.container,
                    Key=self._location.key,
                ),
            )
            .map(is_made_of_them)
            .lash(_not_stored)
        )

    def _part_buffer(self) -> bytearray:
        """The part being filled: the spare buffer when it has this part's size."""
        if self._filling is None:
            size = self._plan.part_bytes(self._sent + 1)
            spare, self._spare = self._spare, None
            self._filling = spare if spare is not None and len(spare) == size else bytearray(size)
            self._filled = 0
        return self._filling

    def _send_filled(self) -> Result[None, ProviderError]:
        """Hand the filled part to an upload thread, once fewer than PARTS_IN_FLIGHT are."""
        part, filled = self._filling, self._filled
        assert part is not None  # a part is only sent once filled
        match self._upload_started():
            case Failure() as failed:
                return failed
            case Success(upload_id):
                pass
        number = self._sent + 1
        if number > MAX_PARTS:
            return Failure(
                ProviderError.resource_exhausted(f"{self.url}: more than {MAX_PARTS} parts")
            )
        if len(self._in_flight) == PARTS_IN_FLIGHT:
            match self._collect_oldest():
                case Failure() as failed:
                    return failed
        body = _shrunk(part, filled)
        assert self._uploads is not None  # made with the upload
        future = self._uploads.submit(self._sent_part, upload_id, number, body)
        self._in_flight.append((future, part))
        self._sent = number
        self._filling, self._filled = None, 0
        return Success(None)

    def _upload_started(self) -> Result[str, ProviderError]:
        """The upload's id, the upload started (and its threads made) at the first part."""
        if self._upload_id is not None:
            return Success(self._upload_id)
        match self._start_upload():
            case Failure() as failed:
                return failed
            case Success(upload_id):
                self._upload_id = upload_id
        self._uploads = ThreadPoolExecutor(PARTS_IN_FLIGHT, thread_name_prefix="s3-part")
        return Success(upload_id)

    def _sent_part(
        self, upload_id: str, number: int, body: bytes
    ) -> Result[CompletedPartTypeDef, ProviderError]:
        """Upload one part (on an upload thread), resent whole from its buffer if need be."""
        bucket, key = self._location.container, self._location.key

        def completed(answer: UploadPartOutputTypeDef) -> CompletedPartTypeDef:
            return {"ETag": answer["ETag"], "PartNumber": number}

        return self._patient(
            f"write part {number} of",
            partial(
                self._client.upload_part,
                Bucket=bucket,
                Key=key,
                UploadId=upload_id,
                PartNumber=number,
                Body=body,
            ),
        ).map(completed)

    def _collect_oldest(self) -> Result[None, ProviderError]:
        """Wait for the oldest part in flight: its failure is answered, its buffer is spare."""
        future, part = self._in_flight.popleft()
        match future.result():
            case Failure() as failed:
                return failed
            case Success(completed):
                self._parts.append(completed)
        self._spare = part
        return Success(None)

    def _failed_part(self) -> Result[None, ProviderError]:
        """A part that failed in the background fails the next write."""
        for future, _ in self._in_flight:
            if future.done():
                match future.result():
                    case Failure() as failed:
                        return failed
        return Success(None)

    def _stop_uploads(self) -> None:
        """Wait for the upload threads to end; none is left behind."""
        if self._uploads is not None:
            self._uploads.shutdown(wait=True, cancel_futures=True)
            self._uploads = None

    def _start_upload(self) -> Result[str, ProviderError]:
        """A multipart upload, and its marker for the sweep (aborted if the marker fails)."""
        bucket, key = self._location.container, self._location.key
        match self._patient(
            "write", partial(self._client.create_multipart_upload, Bucket=bucket, Key=key)
        ):
            case Failure() as failed:
                return failed
            case Success(started):
                upload_id = started["UploadId"]
        note = json.dumps({"key": key, "upload_id": upload_id}).encode()
        marked = self._patient_call(
            "write", partial(self._client.put_object, Bucket=bucket, Key=self._marker, Body=note)
        )
        match marked:
            case Failure(error) as failed if error.kind is ErrorKind.UNAVAILABLE:
                self._aborts.defer(
                    f"the multipart upload of {self.url}",
                    partial(
                        remove_marked_upload, self._client, self._location, self._marker, upload_id
                    ),
                )
                return failed
            case Failure() as failed:
                match abort_upload(self._client, self._location, key, upload_id):
                    case Failure() as abort_failed:
                        return abort_failed
                return failed
        return Success(upload_id)


def _not_stored(error: ProviderError) -> Result[bool, ProviderError]:
    return Success(False) if error.kind is ErrorKind.NOT_FOUND else Failure(error)


def _shrunk(part: bytearray, filled: int) -> bytes:
    """The part's first `filled` bytes as a body, without a copy: a short part is the last
    one, cut in place. botocore signs and urllib3 sends any bytes-like body as it is (the
    stubs say bytes only)."""
    if filled < len(part):
        del part[filled:]
    return cast(bytes, part)
