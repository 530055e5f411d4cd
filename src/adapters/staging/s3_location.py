"""The s3 staging type's rules: `s3://<bucket>/<key>`, the bucket always from the options, the
URL's first segment dropped only when it equals that bucket (else the whole remainder is the
key); static credentials; the sweep's place `<bucket>/[<prefix>/]vmmigrations/`, one folder per
migration below it (a sweep never lists the rest of a shared bucket).

Apart from the store (`s3.py`): these rules need no boto3, so a provider without the `s3` extra
still reads an s3 request, and refuses it as a type it cannot serve.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import SplitResult, urlsplit

from pydantic import SecretStr
from returns.result import Result, Success

from pyrigaud.adapters.staging.rules import (
    PLACE_NAME,
    StoreContext,
    invalid,
    required_for,
    text_options,
)
from pyrigaud.application.ports.staging import StagingStorage
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.staging import (
    StagedHost,
    StagedLocation,
    StagingCredentials,
    StagingOptions,
    StagingType,
)

S3 = StagingType("s3")
DEFAULT_REGION = "us-east-1"
MAX_S3_KEY_BYTES = 1024
BUCKET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{1,253}[A-Za-z0-9]")
HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(:[0-9]{1,5})?")
DEFAULT_PORTS = {"http": 80, "https": 443}
# The manager stages each migration's S3 objects under `[<prefix>/]vmmigrations/<ns>/<name>/`.
MIGRATIONS_FOLDER = "vmmigrations"
# The options' keys as the manager sends them.
TEXT_OPTIONS = ("bucket", "endpoint", "region", "prefix")
PATH_STYLE = "usePathStyle"
ACCESS_KEY_ID = "accessKeyID"
SECRET_ACCESS_KEY = "secretAccessKey"  # noqa: S105 - the key's name, not a secret
SESSION_TOKEN = "sessionToken"  # noqa: S105 - the key's name, not a secret


class S3Options(StagingOptions):
    """`endpoint` normalised to `scheme://host[:port]` ("" means AWS itself)."""

    bucket: str = ""
    endpoint: str = ""
    region: str = DEFAULT_REGION
    prefix: str = ""
    use_path_style: bool = False

    def host(self) -> StagedHost | None:
        """The endpoint's host; AWS itself (no endpoint) is reached by name, as boto3 does."""
        if not self.endpoint:
            return None
        parts = urlsplit(self.endpoint)
        return StagedHost(
            field=fields.storage_option("endpoint"),
            host=parts.hostname or "",
            port=parts.port or DEFAULT_PORTS[parts.scheme],
        )


class S3Credentials(StagingCredentials):
    """Static credentials; the secrets are `SecretStr`."""

    access_key_id: str
    secret_access_key: SecretStr
    session_token: SecretStr | None = None


class S3Rules:
    staging_type = S3
    shape = "s3://<bucket>/<key>, without query or fragment"
    option_keys = (*TEXT_OPTIONS, PATH_STYLE)
    takes_query = False
    takes_credentials = True
    no_place = ""

    def options(self, options: Mapping[str, object]) -> Result[S3Options, ProviderError]:
        return Result.do(
            S3Options(
                bucket=text.get("bucket", ""),
                endpoint=endpoint,
                region=text.get("region") or DEFAULT_REGION,
                prefix=text.get("prefix", ""),
                use_path_style=flag,
            )
            for text in text_options(options, TEXT_OPTIONS)
            for endpoint in _endpoint(text.get("endpoint", ""))
            for flag in _flag(options.get(PATH_STYLE))
        )

    def located(
        self,
        field: str,
        url: str,
        parts: SplitResult,
        options: S3Options,
        credentials: Mapping[str, str] | None,
    ) -> Result[StagedLocation, ProviderError]:
        bucket = fields.storage_option("bucket")
        if not options.bucket:
            return required_for(bucket, S3)
        if not BUCKET_NAME.fullmatch(options.bucket):
            return invalid(bucket, "must be an S3 bucket name")
        first, rest = parts.netloc, parts.path
        key = rest.removeprefix("/") if first == options.bucket else f"{first}{rest}"
        if not key or key.endswith("/") or len(key.encode()) > MAX_S3_KEY_BYTES:
            return invalid(field, "must name an object key of 1 to 1024 bytes, not a folder")
        return _credentials(credentials).map(
            lambda checked: StagedLocation(
                staging_type=S3,
                field=field,
                url=url,
                container=options.bucket,
                key=key,
                options=options,
                credentials=checked,
            )
        )

    def place_url(self, options: S3Options) -> Result[str, ProviderError]:
        prefix = options.prefix.strip("/")
        folder = f"{prefix}/{MIGRATIONS_FOLDER}" if prefix else MIGRATIONS_FOLDER
        return Success(f"s3://{options.bucket}/{folder}/{PLACE_NAME}")


def s3_store(context: StoreContext) -> StagingStorage | None:
    """The s3 type's store, where the `s3` extra (boto3) is installed."""
    try:
        from pyrigaud.adapters.staging.s3 import S3Staging  # noqa: PLC0415 - an optional extra
    except ImportError:
        return None
    return S3Staging(
        owner=context.owner,
        clock=context.clock,
        retry_seconds=context.retry_seconds,
        aborts=context.aborts,
        companion_suffixes=context.companion_suffixes,
    )


def s3_terms(location: StagedLocation) -> tuple[S3Options, S3Credentials]:
    """The options and credentials S3Rules put on an s3 location (a location of another type
    reaching the S3 store is a bug)."""
    options, credentials = location.options, location.credentials
    if not isinstance(options, S3Options) or not isinstance(credentials, S3Credentials):
        raise TypeError(f"not an s3 location: {location.staging_type!r}")
    return options, credentials


def _credentials(
    credentials: Mapping[str, str] | None,
) -> Result[S3Credentials | None, ProviderError]:
    if credentials is None:
        return Success(None)  # read at each use
    for key in (ACCESS_KEY_ID, SECRET_ACCESS_KEY):
        if not credentials.get(key):
            return required_for(fields.staging_credential(key), S3)
    token = credentials.get(SESSION_TOKEN)
    return Success(
        S3Credentials(
            access_key_id=credentials[ACCESS_KEY_ID],
            secret_access_key=SecretStr(credentials[SECRET_ACCESS_KEY]),
            session_token=SecretStr(token) if token else None,
        )
    )


def _endpoint(endpoint: str) -> Result[str, ProviderError]:
    """`http://` means plaintext, `https://` or a bare host[:port] means TLS, "" means AWS."""
    if not endpoint:
        return Success("")
    field = fields.storage_option("endpoint")
    scheme, _, rest = endpoint.rpartition("://")
    if scheme.lower() not in ("", "http", "https"):
        return invalid(field, "must be http://, https:// or a bare host[:port]")
    host = rest.removesuffix("/")
    match = HOST_PORT.fullmatch(host)
    if match is None or (match.group(2) and not 0 < int(match.group(2)[1:]) < 65536):
        return invalid(field, "must be a host[:port], optionally after http:// or https://")
    return Success(f"{scheme.lower() or 'https'}://{host}")


def _flag(value: object) -> Result[bool, ProviderError]:
    if value is None or isinstance(value, bool):
        return Success(bool(value))
    if isinstance(value, str) and value.strip().lower() in ("true", "false", ""):
        return Success(value.strip().lower() == "true")
    return invalid(fields.storage_option(PATH_STYLE), "must be true or false")
