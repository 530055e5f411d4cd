"""Where a migrating disk is staged: the manager's URL, storage options and credentials, checked.

The manager sends the same URL to ExportDisk (`destination_url`) and ImportDisk (`source_url`),
with `storage_options_json` and, for S3, a credentials map (docs/migration.md):

- pvc: `pvc://<pvc>/<path>`, a file under the PVC's mount in the provider's pod;
- s3:  `s3://<bucket>/<key>`: the bucket always comes from the options, and the URL's first
  segment is dropped only when it equals that bucket (else the whole remainder is the key);
- nfs: `nfs://<server><export>[/<path>]/<file>[?gid=G&uid=U]`, uid/gid being the AUTH_SYS
  identity the file is written and read with.

Every refusal names the field or key the manager filled (`storage_options_json.bucket`,
`credentials.secretAccessKey`, ...). Credentials never appear in a message or a repr.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum
from urllib.parse import parse_qsl, urlsplit

from pydantic import Field, SecretStr
from returns.result import Failure, Result, Success

from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.values import Value


class StagingType(StrEnum):
    """Where a migrating disk is staged: the manager's `backend_type` (its VMMigration's
    spec.storage.type). Called a type here so that "backend" names one thing only, the
    hypervisor a provider serves."""

    PVC = "pvc"
    NFS = "nfs"
    S3 = "s3"


OPTIONS = "storage_options_json"
CREDENTIALS = "credentials"
DEFAULT_REGION = "us-east-1"
MAX_ID = 4_294_967_295  # uid/gid: the CRD's bounds
MAX_S3_KEY_BYTES = 1024
PVC_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")  # a Kubernetes name
BUCKET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{1,253}[A-Za-z0-9]")
HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(:[0-9]{1,5})?")
NFS_SERVER = re.compile(r"\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+")
UNSAFE_CHARACTERS = re.compile(r"[\x00-\x20\x7f?#&\\]")
STRING_OPTIONS = ("bucket", "endpoint", "region", "prefix", "server", "export", "path")
# The manager stages each migration's S3 objects under `[<prefix>/]vmmigrations/<ns>/<name>/`.
MIGRATIONS_FOLDER = "vmmigrations"


class StagingOptions(Value):
    """The non-secret storage options; `endpoint` is normalised to `scheme://host[:port]`
    ("" means AWS itself), and uid/gid are the URL's when it names them."""

    bucket: str = ""
    endpoint: str = ""
    region: str = DEFAULT_REGION
    prefix: str = ""
    use_path_style: bool = False
    server: str = ""
    export: str = ""
    path: str = ""
    uid: int | None = None
    gid: int | None = None


class StorageCredentials(Value):
    """S3 static credentials; no field shows in a repr, and the secrets are `SecretStr`."""

    access_key_id: str = Field(repr=False)
    secret_access_key: SecretStr = Field(repr=False)
    session_token: SecretStr | None = Field(default=None, repr=False)


class StagedDigest(Value):
    """What was staged or read: lowercase hex SHA-256 and the number of bytes."""

    sha256: str
    size_bytes: int


class StagedSweep(Value):
    """What a sweep of the staging storage removed, and what it could not look through."""

    removed: int = 0
    failures: tuple[ProviderError, ...] = ()


class StagedLocation(Value):
    """One staged object, named by the request's `field` (`destination_url`, `source_url`).
    `container` is the PVC name, the bucket or the NFS export; `key` is the object's path
    inside it (relative: no leading '/')."""

    staging_type: StagingType
    field: str
    url: str
    container: str
    key: str
    options: StagingOptions = StagingOptions()
    credentials: StorageCredentials | None = Field(default=None, repr=False)
    # The checked address the store's connections go to ("": the host as named), set by the
    # storage gate once it resolved and checked the host.
    address: str = ""

    @property
    def name(self) -> str:
        """The object's own name, the last segment of its key."""
        return self.key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> str:
        """The key's folder inside the container ("" at its top)."""
        return self.key.rsplit("/", 1)[0] if "/" in self.key else ""


def parse_staged_location(
    field: str,
    url: str,
    staging_type: StagingType,
    options: Mapping[str, object],
    credentials: Mapping[str, str],
) -> Result[StagedLocation, ProviderError]:
    """The location `url` (the request's `field`) names on `staging_type`, or the first problem."""
    try:
        parts = urlsplit(url)
    except ValueError:  # an unbalanced IPv6 bracket
        return _invalid(field, f"must be {_SHAPES[staging_type]}")
    if parts.scheme.lower() != staging_type.value:
        return _invalid(
            field, f"must be a {staging_type.value}:// URL for backend_type {staging_type.value!r}"
        )
    if "@" in parts.netloc:
        return _invalid(field, "must not carry credentials")  # never echoed: it may hold some
    if parts.fragment or (parts.query and staging_type is not StagingType.NFS):
        return _invalid(field, f"must be {_SHAPES[staging_type]}")

    def located(checked: StagingOptions) -> Result[StagedLocation, ProviderError]:
        if staging_type is StagingType.PVC:
            return _pvc(field, url, parts.netloc, parts.path, checked)
        if staging_type is StagingType.S3:
            return _s3(
                field=field,
                url=url,
                first=parts.netloc,
                rest=parts.path,
                options=checked,
                credentials=credentials,
            )
        return _nfs(
            field=field,
            url=url,
            server=parts.netloc,
            path=parts.path,
            query=parts.query,
            options=checked,
        )

    return _options(options, staging_type).bind(located)


def parse_staging_place(
    staging_type: StagingType, options: Mapping[str, object], credentials: Mapping[str, str]
) -> Result[StagedLocation, ProviderError]:
    """The folder where the manager stages every migration's objects for these storage options
    (its URL up to the migration's own part), as the location of an object in it: what a sweep
    of that place takes. S3: `<bucket>/[<prefix>/]vmmigrations/`, one folder per migration
    below it (a sweep never lists the rest of a shared bucket); NFS: `<export>[/<path>]/`,
    where the manager's flat names of every migration lie. A PVC is no place to name: every
    mounted one is swept already."""
    return (
        _options(options, staging_type)
        .bind(lambda checked: _place_url(staging_type, checked))
        .bind(lambda url: parse_staged_location(OPTIONS, url, staging_type, options, credentials))
    )


def _place_url(staging_type: StagingType, checked: StagingOptions) -> Result[str, ProviderError]:
    if staging_type is StagingType.S3:
        prefix = checked.prefix.strip("/")
        folder = f"{prefix}/{MIGRATIONS_FOLDER}" if prefix else MIGRATIONS_FOLDER
        return Success(f"s3://{checked.bucket}/{folder}/{_PLACE_NAME}")
    if staging_type is StagingType.NFS:
        for key in ("server", "export"):
            if not getattr(checked, key):
                return _invalid(f"{OPTIONS}.{key}", "required for backend_type 'nfs'")
        path = checked.path.strip("/")
        url = f"nfs://{checked.server}{checked.export.rstrip('/')}/{path + '/' if path else ''}"
        return Success(url + _PLACE_NAME)
    return _invalid("backend_type", "must be s3 or nfs (every mounted PVC is swept)")


# A place's nominal object, read as "everything in its folder": a sweep looks only at the folder.
_PLACE_NAME = "*"

_SHAPES = {
    StagingType.PVC: "pvc://<pvc>/<path>, without query or fragment",
    StagingType.S3: "s3://<bucket>/<key>, without query or fragment",
    StagingType.NFS: "nfs://<server><export>/<file>[?gid=G&uid=U]",
}


def _pvc(
    field: str, url: str, pvc: str, path: str, options: StagingOptions
) -> Result[StagedLocation, ProviderError]:
    if not PVC_NAME.fullmatch(pvc):
        return _invalid(field, "the part after pvc:// must be a PVC name")
    return _relative_path(field, path.removeprefix("/")).map(
        lambda key: StagedLocation(
            staging_type=StagingType.PVC,
            field=field,
            url=url,
            container=pvc,
            key=key,
            options=options,
        )
    )


def _s3(
    *,
    field: str,
    url: str,
    first: str,
    rest: str,
    options: StagingOptions,
    credentials: Mapping[str, str],
) -> Result[StagedLocation, ProviderError]:
    if not options.bucket:
        return _invalid(f"{OPTIONS}.bucket", "required for backend_type 's3'")
    if not BUCKET_NAME.fullmatch(options.bucket):
        return _invalid(f"{OPTIONS}.bucket", "must be an S3 bucket name")
    key = rest.removeprefix("/") if first == options.bucket else f"{first}{rest}"
    if not key or key.endswith("/") or len(key.encode()) > MAX_S3_KEY_BYTES:
        return _invalid(field, "must name an object key of 1 to 1024 bytes, not a folder")
    return _s3_credentials(credentials).map(
        lambda checked: StagedLocation(
            staging_type=StagingType.S3,
            field=field,
            url=url,
            container=options.bucket,
            key=key,
            options=options,
            credentials=checked,
        )
    )


def _s3_credentials(credentials: Mapping[str, str]) -> Result[StorageCredentials, ProviderError]:
    for key in ("accessKeyID", "secretAccessKey"):
        if not credentials.get(key):
            return _invalid(f"{CREDENTIALS}.{key}", "required for backend_type 's3'")
    token = credentials.get("sessionToken")
    return Success(
        StorageCredentials(
            access_key_id=credentials["accessKeyID"],
            secret_access_key=SecretStr(credentials["secretAccessKey"]),
            session_token=SecretStr(token) if token else None,
        )
    )


def _nfs(
    *, field: str, url: str, server: str, path: str, query: str, options: StagingOptions
) -> Result[StagedLocation, ProviderError]:
    if not NFS_SERVER.fullmatch(server):
        return _invalid(field, "must name an NFS server (a host name or address, no port)")
    if options.server and options.server != server:
        return _invalid(f"{OPTIONS}.server", f"does not match the server of {field}")
    # Without the option, the file's folder is mounted, as libnfs does with a bare URL.
    export = options.export.rstrip("/") if options.export else path.rsplit("/", 1)[0]
    if not path.startswith(f"{export}/"):
        return _invalid(field, f"its path must start with {OPTIONS}.export followed by a file")

    def located(key: str, uid: int | None, gid: int | None) -> StagedLocation:
        return StagedLocation(
            staging_type=StagingType.NFS,
            field=field,
            url=url,
            container=export or "/",
            key=key,
            options=options.model_copy(
                update={
                    "server": server,
                    "uid": options.uid if uid is None else uid,
                    "gid": options.gid if gid is None else gid,
                }
            ),
        )

    return _relative_path(field, path.removeprefix(f"{export}/")).bind(
        lambda key: _identity(field, query).map(lambda ids: located(key, *ids))
    )


def _identity(field: str, query: str) -> Result[tuple[int | None, int | None], ProviderError]:
    """The URL's uid and gid query values (the only keys it may carry)."""
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        return _invalid(field, "its query must be gid=<n>&uid=<n>")
    found: dict[str, int] = {}
    for key, value in pairs:
        if key not in ("uid", "gid") or key in found:
            return _invalid(field, "its query may hold only one uid and one gid")
        match _identifier(f"{field} {key}", value):
            case Failure(error):
                return Failure(error)
            case Success(identifier):
                found[key] = identifier
    return Success((found.get("uid"), found.get("gid")))


def _relative_path(field: str, path: str) -> Result[str, ProviderError]:
    segments = path.split("/")
    if any(segment in ("", ".", "..") or UNSAFE_CHARACTERS.search(segment) for segment in segments):
        return _invalid(
            field, "its path must be relative, without '.', '..', empty parts or control characters"
        )
    return Success(path)


def _options(
    options: Mapping[str, object], staging_type: StagingType
) -> Result[StagingOptions, ProviderError]:
    """The typed options; unknown keys are ignored, as Go's decoder does."""
    values: dict[str, object] = {}
    for key in STRING_OPTIONS:
        value = options.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            return _invalid(f"{OPTIONS}.{key}", "must be a string")
        values[key] = value.strip()
    declared = options.get("backend")
    if isinstance(declared, str) and declared.strip() and declared.strip() != staging_type.value:
        return _invalid(f"{OPTIONS}.backend", f"does not match backend_type {staging_type.value!r}")
    values["region"] = values.get("region") or DEFAULT_REGION
    match _endpoint(str(values.get("endpoint", ""))):
        case Failure(error):
            return Failure(error)
        case Success(endpoint):
            values["endpoint"] = endpoint
    match _flag(options.get("usePathStyle")):
        case Failure(error):
            return Failure(error)
        case Success(flag):
            values["use_path_style"] = flag
    for key in ("uid", "gid"):
        if options.get(key) is not None:
            match _identifier(f"{OPTIONS}.{key}", options[key]):
                case Failure(error):
                    return Failure(error)
                case Success(identifier):
                    values[key] = identifier
    export = str(values.get("export", ""))
    if export and not export.startswith("/"):
        return _invalid(f"{OPTIONS}.export", "must start with '/'")
    return Success(StagingOptions.model_validate(values))


def _endpoint(endpoint: str) -> Result[str, ProviderError]:
    """`http://` means plaintext, `https://` or a bare host[:port] means TLS, "" means AWS."""
    if not endpoint:
        return Success("")
    field = f"{OPTIONS}.endpoint"
    scheme, _, rest = endpoint.rpartition("://")
    if scheme.lower() not in ("", "http", "https"):
        return _invalid(field, "must be http://, https:// or a bare host[:port]")
    host = rest.removesuffix("/")
    match = HOST_PORT.fullmatch(host)
    if match is None or (match.group(2) and not 0 < int(match.group(2)[1:]) < 65536):
        return _invalid(field, "must be a host[:port], optionally after http:// or https://")
    return Success(f"{scheme.lower() or 'https'}://{host}")


def _flag(value: object) -> Result[bool, ProviderError]:
    if value is None or isinstance(value, bool):
        return Success(bool(value))
    if isinstance(value, str) and value.strip().lower() in ("true", "false", ""):
        return Success(value.strip().lower() == "true")
    return _invalid(f"{OPTIONS}.usePathStyle", "must be true or false")


def _identifier(field: str, value: object) -> Result[int, ProviderError]:
    """A uid or gid: an integer (or its decimal text) in 0..4294967295."""
    if isinstance(value, str) and value.strip().isdecimal():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ID:
        return _invalid(field, f"must be an integer from 0 to {MAX_ID}")
    return Success(value)


def _invalid(field: str, problem: str) -> Failure[ProviderError]:
    return Failure(ProviderError.invalid_spec(field, problem))
