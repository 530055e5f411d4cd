"""S3's answers as this provider's errors (never echoing a secret), and the calls on an upload
that both the writer and the leftover sweep make: abort it, and remove the marker that names it
(`s3.py` says why uploads have markers).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, TypeVar

from botocore.exceptions import BotoCoreError, ClientError
from returns.result import Failure, Result, Success

from pyrigaud.adapters.staging.s3_location import s3_terms
from pyrigaud.domain.errors import ErrorKind, ProviderError
from pyrigaud.domain.staging import StagedLocation

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

T = TypeVar("T")

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


def remove_marked_upload(
    client: S3Client, location: StagedLocation, marker: str, upload_id: str | None = None
) -> Result[None, ProviderError]:
    """Abort the upload a marker names (read from it unless given), then delete the marker."""
    if upload_id is not None:
        return _aborted_and_unmarked(client, location, location.key, upload_id, marker)

    def marker_note() -> bytes:
        return client.get_object(Bucket=location.container, Key=marker)["Body"].read()

    match calling(location, "sweep", marker_note):
        case Failure(error) if error.kind is ErrorKind.NOT_FOUND:
            return Success(None)  # swept by another replica
        case Failure() as failed:
            return failed
        case Success(body):
            note = json.loads(body)
    return _aborted_and_unmarked(client, location, str(note["key"]), str(note["upload_id"]), marker)


def _aborted_and_unmarked(
    client: S3Client, location: StagedLocation, key: str, upload_id: str, marker: str
) -> Result[None, ProviderError]:
    """The upload aborted, then the marker that names it deleted."""
    return Result.do(
        None
        for _ in abort_upload(client, location, key, upload_id)
        for _ in delete_marker(client, location, marker)
    )


def delete_marker(
    client: S3Client, location: StagedLocation, marker: str
) -> Result[None, ProviderError]:
    return delete_object(client, location, marker, "remove the marker of")


def delete_object(
    client: S3Client, location: StagedLocation, key: str, action: str = "sweep"
) -> Result[None, ProviderError]:
    """The object `key` in the location's bucket deleted (S3 answers a missing one alike)."""
    return called(
        location, action, partial(client.delete_object, Bucket=location.container, Key=key)
    )


def abort_upload(
    client: S3Client, location: StagedLocation, key: str, upload_id: str
) -> Result[None, ProviderError]:
    return called(
        location,
        "abort an upload to",
        partial(
            client.abort_multipart_upload, Bucket=location.container, Key=key, UploadId=upload_id
        ),
    ).lash(_already_gone)  # what abort wanted


def _already_gone(error: ProviderError) -> Result[None, ProviderError]:
    return Success(None) if error.kind is ErrorKind.NOT_FOUND else Failure(error)


def calling(
    location: StagedLocation, action: str, call: Callable[[], T]
) -> Result[T, ProviderError]:
    """`call`, with S3's answers turned into this provider's kinds (never echoing a secret):
    the one place botocore's exceptions become values."""
    try:
        return Success(call())
    except ClientError as error:
        return Failure(refusal(location, action, error))
    except BotoCoreError as error:
        where = s3_terms(location)[0].endpoint or "AWS S3"
        return Failure(
            ProviderError.unavailable(
                f"cannot {action} {location.url}: {where} did not answer ({type(error).__name__})"
            )
        )


def called(
    location: StagedLocation, action: str, call: Callable[[], object]
) -> Result[None, ProviderError]:
    """`calling` for a call whose answer is not needed."""
    return Result.do(None for _ in calling(location, action, call))


def refusal(location: StagedLocation, action: str, error: ClientError) -> ProviderError:
    code = str(error.response.get("Error", {}).get("Code", ""))
    status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
    what = f"cannot {action} {location.url}"
    if code in DENIED_CODES or status == 403:
        return ProviderError.permission_denied(
            f"{what}: S3 refused the credentials ({code or status}); check the secret "
            "named by credentialsSecretRef and its access to the bucket"
        )
    if code == "NoSuchBucket":
        return ProviderError.not_found(f"{what}: no bucket {location.container!r}")
    if code in MISSING_CODES or status == 404:
        return ProviderError.not_found(f"{what}: no such object")
    if status >= 500 or status == 429 or code in ("SlowDown", "RequestTimeout"):
        return ProviderError.unavailable(f"{what}: S3 answered {code or status}")
    return ProviderError.failed_precondition(f"{what}: S3 answered {code or status}")
