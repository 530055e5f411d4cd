"""The manager's staging URLs, options and credentials -> one checked location, or the field."""

from __future__ import annotations

from typing import TypeVar

import pytest
from returns.result import Result

from pyrigaud.adapters.staging.nfs_location import NFS, NfsOptions
from pyrigaud.adapters.staging.pvc_location import PVC
from pyrigaud.adapters.staging.registry import STAGING_TYPES
from pyrigaud.adapters.staging.s3_location import S3, S3Credentials, S3Options
from pyrigaud.domain.errors import ErrorKind, ProviderError
from pyrigaud.domain.models import StagingType
from pyrigaud.domain.staging import StagedLocation, StagingOptions
from pyrigaud.domain.staging_names import temporary_name, temporary_started_at
from pyrigaud.entrypoints.grpc.wire.field_names import for_the_manager

from support import error_of, ok

OptionsT = TypeVar("OptionsT", bound=StagingOptions)

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
TOKEN = "FwoGZXIvYXdzEXAMPLETOKEN"
CREDENTIALS = {"accessKeyID": "AKIAEXAMPLE", "secretAccessKey": SECRET, "sessionToken": TOKEN}
S3_OPTIONS = {
    "backend": "s3",
    "bucket": "mig",
    "endpoint": "http://10.0.0.9:9000",
    "region": "eu-west-3",
    "prefix": "lab",
    "usePathStyle": True,
}
NFS_OPTIONS = {
    "backend": "nfs",
    "usePathStyle": False,
    "server": "10.0.0.5",
    "export": "/export/migrations",
    "path": "vr",
    "uid": 1000,
    "gid": 1000,
}
PVC_URL = "pvc://mig-pvc/vmmigrations/ns/m1/export.qcow2"
S3_URL = "s3://mig/lab/vmmigrations/ns/m1/export.vmdk"
NFS_URL = "nfs://10.0.0.5/export/migrations/vr/vmmigrations-ns-m1-export.qcow2?gid=1001&uid=1002"


def s3(
    url: str = S3_URL,
    options: dict[str, object] | None = None,
    credentials: dict[str, str] = CREDENTIALS,
) -> Result[StagedLocation, ProviderError]:
    return STAGING_TYPES.parse_location(
        "destination_url",
        url,
        S3,
        S3_OPTIONS if options is None else options,
        credentials,
    )


def nfs(
    url: str = NFS_URL, options: dict[str, object] | None = None
) -> Result[StagedLocation, ProviderError]:
    return STAGING_TYPES.parse_location(
        "source_url", url, NFS, NFS_OPTIONS if options is None else options, {}
    )


def options_of(location: StagedLocation, kind: type[OptionsT]) -> OptionsT:
    """The location's options as its staging type's adapter made them."""
    assert isinstance(location.options, kind), location.options
    return location.options


def invalid_field(result: Result[StagedLocation, ProviderError]) -> str:
    error = error_of(result)
    assert error.kind is ErrorKind.INVALID_SPEC, error
    return for_the_manager(error).split(":", 1)[0]


def test_a_pvc_url_names_a_file_inside_its_pvc() -> None:
    location = ok(STAGING_TYPES.parse_location("destination_url", PVC_URL, PVC, {}, {}))
    assert (location.container, location.key) == ("mig-pvc", "vmmigrations/ns/m1/export.qcow2")
    assert (location.parent, location.name) == ("vmmigrations/ns/m1", "export.qcow2")


@pytest.mark.parametrize(
    "url",
    [
        "pvc://mig-pvc/../other/x",
        "pvc://mig-pvc/a/./x",
        "pvc://mig-pvc/a//x",
        "pvc://mig-pvc/",
        "pvc://Not_A_Pvc/x",
        "pvc://mig-pvc/x?y=1",
        "pvc://user:pw@mig-pvc/x",
        "s3://mig/x",
    ],
)
def test_a_malformed_pvc_url_names_the_field(url: str) -> None:
    result = STAGING_TYPES.parse_location("destination_url", url, PVC, {}, {})
    assert invalid_field(result) == "destination_url"
    assert "pw" not in error_of(result).message


def test_an_s3_url_drops_its_first_segment_only_when_it_is_the_bucket() -> None:
    assert ok(s3()).key == "lab/vmmigrations/ns/m1/export.vmdk"
    other = ok(s3("s3://elsewhere/lab/x.vmdk"))
    assert (other.container, other.key) == ("mig", "elsewhere/lab/x.vmdk")


def test_s3_options_are_typed_and_the_endpoint_normalised() -> None:
    options = options_of(ok(s3()), S3Options)
    assert (options.endpoint, options.region, options.use_path_style) == (
        "http://10.0.0.9:9000",
        "eu-west-3",
        True,
    )
    bare = options_of(ok(s3(options={"bucket": "mig", "endpoint": "minio.lab:9000"})), S3Options)
    assert (bare.endpoint, bare.region, bare.use_path_style) == (
        "https://minio.lab:9000",
        "us-east-1",
        False,
    )
    assert options_of(ok(s3(options={"bucket": "mig"})), S3Options).endpoint == ""  # AWS itself
    path_style = ok(s3(options={"bucket": "mig", "usePathStyle": "true"}))
    assert options_of(path_style, S3Options).use_path_style


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({}, "storage_options_json.bucket"),
        ({"bucket": ""}, "storage_options_json.bucket"),
        ({"bucket": "a"}, "storage_options_json.bucket"),
        ({"bucket": 7}, "storage_options_json.bucket"),
        ({"bucket": "mig", "endpoint": "ftp://host"}, "storage_options_json.endpoint"),
        ({"bucket": "mig", "endpoint": "http://host:99999"}, "storage_options_json.endpoint"),
        ({"bucket": "mig", "endpoint": "http://host/path"}, "storage_options_json.endpoint"),
        ({"bucket": "mig", "usePathStyle": "yes"}, "storage_options_json.usePathStyle"),
        ({"bucket": "mig", "backend": "nfs"}, "storage_options_json.backend"),
    ],
)
def test_bad_s3_options_name_their_key(options: dict[str, object], field: str) -> None:
    assert invalid_field(s3(options=options)) == field


@pytest.mark.parametrize("missing", ["accessKeyID", "secretAccessKey"])
def test_a_missing_credential_key_is_named_and_no_secret_is_shown(missing: str) -> None:
    credentials = {key: value for key, value in CREDENTIALS.items() if key != missing}
    result = s3(credentials=credentials)
    assert invalid_field(result) == f"credentials.{missing}"
    assert SECRET not in error_of(result).message


def test_credentials_never_show_in_a_repr() -> None:
    location = ok(s3())
    credentials = location.credentials
    assert isinstance(credentials, S3Credentials), credentials
    for text in (repr(location), str(location), repr(location.credentials)):
        assert SECRET not in text
        assert TOKEN not in text
    assert credentials.secret_access_key.get_secret_value() == SECRET
    assert credentials.session_token is not None


@pytest.mark.parametrize("url", ["s3://mig/", "s3://mig", "s3://mig/dir/", "s3://mig/x#y"])
def test_an_s3_url_without_an_object_key_names_the_field(url: str) -> None:
    assert invalid_field(s3(url)) == "destination_url"


def test_an_nfs_url_splits_at_the_export_and_its_uid_gid_win() -> None:
    location = ok(nfs())
    assert location.container == "/export/migrations"
    assert location.key == "vr/vmmigrations-ns-m1-export.qcow2"
    options = options_of(location, NfsOptions)
    assert (options.server, options.uid, options.gid) == (
        "10.0.0.5",
        1002,
        1001,
    )
    plain = options_of(ok(nfs("nfs://10.0.0.5/export/migrations/vr/x.qcow2")), NfsOptions)
    assert (plain.uid, plain.gid) == (1000, 1000)  # the options' then


def test_an_nfs_url_without_export_option_mounts_the_files_folder() -> None:
    location = ok(nfs("nfs://10.0.0.5/srv/nfs/x.qcow2", options={"backend": "nfs"}))
    assert (location.container, location.key) == ("/srv/nfs", "x.qcow2")


@pytest.mark.parametrize(
    ("url", "options", "field"),
    [
        ("nfs://10.0.0.5/elsewhere/x.qcow2", NFS_OPTIONS, "source_url"),
        ("nfs://10.0.0.6/export/migrations/x.qcow2", NFS_OPTIONS, "storage_options_json.server"),
        ("nfs://10.0.0.5:2049/export/migrations/x", {}, "source_url"),
        ("nfs:///export/migrations/x", {}, "source_url"),
        ("nfs://[::1/export/migrations/x", {}, "source_url"),
        ("nfs://10.0.0.5/export/migrations/../x", NFS_OPTIONS, "source_url"),
        ("nfs://10.0.0.5/export/migrations/x?uid=-1", NFS_OPTIONS, "source_url uid"),
        ("nfs://10.0.0.5/export/migrations/x?uid=4294967296", NFS_OPTIONS, "source_url uid"),
        ("nfs://10.0.0.5/export/migrations/x?mode=7", NFS_OPTIONS, "source_url"),
        ("nfs://10.0.0.5/export/migrations/x?uid=1&uid=2", NFS_OPTIONS, "source_url"),
        ("nfs://10.0.0.5/e/x", {"export": "e"}, "storage_options_json.export"),
        ("nfs://10.0.0.5/e/x", {"export": "/e", "uid": True}, "storage_options_json.uid"),
        ("nfs://10.0.0.5/e/x", {"export": "/e", "gid": "x"}, "storage_options_json.gid"),
        ("nfs://10.0.0.5/e/x", {"export": "/e", "path": 3}, "storage_options_json.path"),
    ],
)
def test_a_malformed_nfs_location_names_the_field(
    url: str, options: dict[str, object], field: str
) -> None:
    assert invalid_field(nfs(url, options)) == field


def test_a_temporary_name_carries_its_owner_and_start() -> None:
    name = temporary_name("export.qcow2", "ns/provider.a", 1_800_000_000.7, "0a1b2c3d")
    assert name.startswith(".export.qcow2.")
    assert name.endswith(".part")
    assert "/" not in name
    assert temporary_started_at(name, "ns/provider.a") == 1_800_000_000
    assert temporary_started_at(name, "ns/provider") is None  # someone else's
    assert temporary_started_at("export.qcow2", "ns/provider.a") is None
    assert temporary_started_at(name.lstrip("."), "ns/provider.a") is None


def test_a_temporary_name_fits_a_file_system_name_whatever_the_final_name() -> None:
    name = temporary_name("x" * 255, "pyrigaud", 1_800_000_000, "0a1b2c3d")
    assert len(name.encode()) <= 255
    assert temporary_started_at(name, "pyrigaud") == 1_800_000_000


@pytest.mark.parametrize(
    ("backend", "options", "folder", "migration_url"),
    [
        (S3, S3_OPTIONS, ("mig", "lab/vmmigrations"), S3_URL),
        (
            S3,
            {**S3_OPTIONS, "prefix": "/a/b/"},
            ("mig", "a/b/vmmigrations"),
            "s3://mig/a/b/vmmigrations/ns/m1/export.vmdk",
        ),
        (
            S3,
            {**S3_OPTIONS, "prefix": ""},
            ("mig", "vmmigrations"),
            "s3://mig/vmmigrations/ns/m1/export.vmdk",
        ),
        (NFS, NFS_OPTIONS, ("/export/migrations", "vr"), NFS_URL),
        (
            NFS,
            {**NFS_OPTIONS, "path": ""},
            ("/export/migrations", ""),
            "nfs://10.0.0.5/export/migrations/vmmigrations-ns-m1-export.qcow2",
        ),
    ],
)
def test_a_staging_place_is_the_folder_the_manager_stages_every_migration_under(
    backend: StagingType,
    options: dict[str, object],
    folder: tuple[str, str],
    migration_url: str,
) -> None:
    credentials = CREDENTIALS if backend is S3 else {}
    place = ok(STAGING_TYPES.parse_place(backend, options, credentials))
    assert (place.container, place.parent) == folder
    # What the manager stages for a migration lies in that folder (NFS) or below it (S3).
    staged = ok(
        STAGING_TYPES.parse_location("source_url", migration_url, backend, options, credentials)
    )
    assert staged.container == place.container
    below = staged.parent.startswith(f"{place.parent}/")
    assert staged.parent == place.parent if backend is NFS else below


@pytest.mark.parametrize(
    ("backend", "options", "credentials", "named"),
    [
        (
            S3,
            {**S3_OPTIONS, "bucket": ""},
            CREDENTIALS,
            "storage_options_json.bucket",
        ),
        (S3, S3_OPTIONS, {}, "credentials.accessKeyID"),
        (NFS, {**NFS_OPTIONS, "server": ""}, {}, "storage_options_json.server"),
        (NFS, {**NFS_OPTIONS, "export": ""}, {}, "storage_options_json.export"),
        (NFS, {**NFS_OPTIONS, "path": "../up"}, {}, "storage_options_json"),
        (PVC, {}, {}, "backend_type"),
    ],
)
def test_a_staging_place_that_cannot_be_swept_names_the_key(
    backend: StagingType,
    options: dict[str, object],
    credentials: dict[str, str],
    named: str,
) -> None:
    error = error_of(STAGING_TYPES.parse_place(backend, options, credentials))
    assert error.kind is ErrorKind.INVALID_SPEC
    assert for_the_manager(error).startswith(f"{named}")
    assert SECRET not in error.message
