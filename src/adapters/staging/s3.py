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

Writing an object, as a multipart upload with a bounded part buffer: `s3_upload.py`; S3's
answers as this provider's errors: `s3_calls.py`.

S3 lists uploads in progress without their metadata (and S3 servers such as moto do not even
report their start), so each upload gets a marker object beside its key, named like the other
backends' temporaries (owner mark, start time) and holding the upload's id; commit and abort
remove it, and the sweep aborts the upload of every stale marker of ours, then the marker.
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from returns.result import Failure, Result, Success

from pyrigaud.adapters.clocks import SystemClock
from pyrigaud.adapters.staging.deferred_aborts import DeferredAborts
from pyrigaud.adapters.staging.patience import STAGING_RETRY_SECONDS, Patience
from pyrigaud.adapters.staging.s3_calls import calling, delete_object, remove_marked_upload
from pyrigaud.adapters.staging.s3_location import s3_terms
from pyrigaud.adapters.staging.s3_upload import MAX_OBJECT_BYTES, PART_BYTES, S3Writer, part_plan
from pyrigaud.adapters.staging.streams import CHUNK_BYTES, RunningDigest
from pyrigaud.application.ports.clock import Clock
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.staging import StagedDigest, StagedLocation
from pyrigaud.domain.staging_names import sweepable, temporary_name

if TYPE_CHECKING:
    from botocore.response import StreamingBody
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import GetObjectOutputTypeDef

MiB = 1024 * 1024


class _ClientMaker:
    """S3 clients from one boto3 session, made at the first S3 transfer.

    A session loads S3's service model once: each client made from a fresh session parses it
    again (about 6 MiB and 60 ms per transfer here), one from the shared session takes 0.3 MiB
    and 3 ms. A botocore session is not safe to use from several threads at once, so clients
    are made under a lock; a client is safe to share, and each has its own events, so the
    address pinning of one does not reach another.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._session: Any = None

    def client(self, **arguments: Any) -> S3Client:
        # Imported here, at the first S3 transfer: boto3 (about 25 MiB) and the session's S3
        # model (15 MiB) are memory a provider that never stages to S3 should not hold.
        import boto3  # noqa: PLC0415

        with self._lock:
            if self._session is None:
                self._session = boto3.session.Session()
            client: S3Client = self._session.client("s3", **arguments)
            return client


@dataclass(frozen=True)
class S3Staging:
    """S3 staging; a client per opened object, configured from that request's options, all
    made from one session."""

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
    clients: _ClientMaker = field(default_factory=_ClientMaker, compare=False, repr=False)
    companion_suffixes: tuple[str, ...] = ()  # what the sweep removes once its object is gone

    def open_read(self, location: StagedLocation) -> Result[S3Reader, ProviderError]:
        def opened(client: S3Client) -> Result[S3Reader, ProviderError]:
            patience = Patience(self.clock, self.retry_seconds)
            get = partial(client.get_object, Bucket=location.container, Key=location.key)
            return patience.retried(
                f"read {location.url}", partial(calling, location, "read", get)
            ).map(
                partial(
                    S3Reader,
                    client,
                    location=location,
                    chunk_bytes=self.chunk_bytes,
                    patience=patience,
                )
            )

        return self._client(location).bind(opened)

    def open_file(self, location: StagedLocation) -> Result[None, ProviderError]:
        """An S3 object is no local file: an image made out of order is written with
        `open_write`."""
        del location
        return Success(None)

    def open_write(
        self, location: StagedLocation, size_bytes: int | None = None
    ) -> Result[S3Writer, ProviderError]:
        if size_bytes is not None and size_bytes > MAX_OBJECT_BYTES:
            return Failure(
                ProviderError.resource_exhausted(
                    f"{location.url}: {size_bytes} bytes is more than S3 stores in one object"
                )
            )

        def opened(client: S3Client) -> S3Writer:
            # No HeadBucket first: it needs s3:ListBucket, which a writer does not otherwise
            # need; a refusal or a missing bucket shows at the first part or the commit.
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

        return self._client(location).map(opened)

    def sweep(
        self, location: StagedLocation, older_than_seconds: float
    ) -> Result[int, ProviderError]:
        """Abort the uploads of this provider's stale markers in the location's folder and
        the folders below it (a staging place's prefix holds one folder per migration), and
        remove the companions there whose object is gone (`sweepable`, folder by folder)."""

        def swept(client: S3Client) -> Result[int, ProviderError]:
            deadline = self.clock.now() - older_than_seconds
            pages = client.get_paginator("list_objects_v2").paginate(
                Bucket=location.container, Prefix=_sibling(location, "")
            )
            match calling(location, "sweep", partial(list, pages)):
                case Failure() as failed:
                    return failed
                case Success(listed):
                    pass
            folders: dict[str, list[str]] = {}
            for page in listed:
                for entry in page.get("Contents", []):
                    folder, _, name = entry["Key"].rpartition("/")
                    folders.setdefault(folder, []).append(name)
            removed = 0
            for folder, names in folders.items():
                stale, orphans = sweepable(names, self.owner, deadline, self.companion_suffixes)
                for marker in stale:
                    match remove_marked_upload(client, location, _key(folder, marker)):
                        case Failure() as failed:
                            return failed
                for orphan in orphans:
                    match delete_object(client, location, _key(folder, orphan)):
                        case Failure() as failed:
                            return failed
                removed += len(stale) + len(orphans)
            return Success(removed)

        return self._client(location).bind(swept)

    def _client(self, location: StagedLocation) -> Result[S3Client, ProviderError]:
        from botocore.config import Config  # noqa: PLC0415

        from pyrigaud.adapters.staging.pinned_http import pin_to_address  # noqa: PLC0415

        options, credentials = s3_terms(location)
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
        client = self.clients.client(
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
        return Success(client)


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
        return self._patience.retried(
            f"read {self._location.url} from byte {self._delivered}",
            partial(calling, self._location, "read", self._next_chunk),
            after_failure=self._drop_body,
        ).map(self._delivering)

    def _delivering(self, chunk: bytes) -> bytes:
        self._delivered += len(chunk)
        self._digest.add(chunk)
        return chunk

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


def _sibling(location: StagedLocation, name: str) -> str:
    return _key(location.parent, name)


def _key(folder: str, name: str) -> str:
    """The key of `name` in `folder` ("": the bucket's top)."""
    return f"{folder}/{name}" if folder else name
