"""Configuration sources and their precedence: defaults < file < environment < flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pyrigaud.adapters.hypervisors.fake.plugin import FakeSettings
from pyrigaud.adapters.hypervisors.libvirt.plugin import LibvirtSettings
from pyrigaud.adapters.hypervisors.vsphere.plugin import VSphereSettings
from pyrigaud.adapters.staging.registry import STAGING_TYPES
from pyrigaud.entrypoints.settings import SettingsError, load_settings


def test_defaults_are_the_managers_ports_on_all_interfaces() -> None:
    settings = load_settings({}, staging_types=STAGING_TYPES)
    assert (settings.port, settings.health_port) == (9443, 8080)
    assert settings.grpc_bind == "[::]:9443"
    assert (settings.provider_type, settings.endpoint) == ("libvirt", "test:///default")
    assert settings.owner_mark == "pyrigaud"
    assert settings.staging_retry_seconds == 30
    assert (
        load_settings(
            {"PYRIGAUD_STAGING_RETRY_SECONDS": "5"}, staging_types=STAGING_TYPES
        ).staging_retry_seconds
        == 5
    )


def test_file_then_environment_then_flags(tmp_path: Path) -> None:
    config = tmp_path / "pyrigaud.toml"
    config.write_text('PYRIGAUD_PORT = 1000\nLOG_LEVEL = "debug"\nPROVIDER_NAME = "p"\n')
    settings = load_settings(
        {"PYRIGAUD_CONFIG": str(config), "PYRIGAUD_PORT": "2000", "PROVIDER_NAMESPACE": "ns"},
        {"PYRIGAUD_PORT": 3000, "PYRIGAUD_HEALTH_PORT": None},
        staging_types=STAGING_TYPES,
    )
    assert settings.port == 3000
    assert settings.health_port == 8080
    assert settings.log_level == "debug"
    assert settings.owner_mark == "ns/p"


def test_mock_is_an_alias_of_fake_and_ipv6_addresses_are_bracketed() -> None:
    settings = load_settings(
        {"PROVIDER_TYPE": "Mock", "PYRIGAUD_LISTEN_ADDRESS": "::1"}, staging_types=STAGING_TYPES
    )
    assert settings.provider_type == "fake"
    assert settings.grpc_bind == "[::1]:9443"


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"PROVIDER_TYPE": "hyperv"}, "PROVIDER_TYPE"),
        ({"PROVIDER_TYPE": "vsphere"}, "PROVIDER_ENDPOINT"),
        ({"PYRIGAUD_PORT": "http"}, "PYRIGAUD_PORT"),
        ({"PYRIGAUD_PORT": "70000"}, "PYRIGAUD_PORT"),
        ({"TLS_ENABLED": "maybe"}, "TLS_ENABLED"),
        (
            {"PROVIDER_TYPE": "fake", "PYRIGAUD_FAKE_LATENCY": "create=slow"},
            "PYRIGAUD_FAKE_LATENCY",
        ),
        ({"LIBVIRT_DOMAIN_TYPE": "xen"}, "LIBVIRT_DOMAIN_TYPE"),
        ({"LIBVIRT_MAX_CONCURRENT_CALLS": "0"}, "LIBVIRT_MAX_CONCURRENT_CALLS"),
        (
            {
                "PROVIDER_TYPE": "vsphere",
                "PROVIDER_ENDPOINT": "https://vc/sdk",
                "TLS_INSECURE_SKIP_VERIFY": "?",
            },
            "TLS_INSECURE_SKIP_VERIFY",
        ),
        ({"PYRIGAUD_STAGING_ALLOWED_HOSTS": "10.0.0.0/8, minio"}, "PYRIGAUD_STAGING_ALLOWED_HOSTS"),
        ({"PYRIGAUD_MAX_IMAGE_VIRTUAL_GIB": "0"}, "PYRIGAUD_MAX_IMAGE_VIRTUAL_GIB"),
        ({"PYRIGAUD_STAGING_RETRY_SECONDS": "-1"}, "PYRIGAUD_STAGING_RETRY_SECONDS"),
    ],
)
def test_bad_settings_name_the_setting(environ: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError, match=named):
        load_settings(environ, staging_types=STAGING_TYPES)


def test_the_selected_hypervisors_own_settings_come_from_the_same_sources(tmp_path: Path) -> None:
    config = tmp_path / "pyrigaud.toml"
    config.write_text('PROVIDER_DEFAULT_CLUSTER = "from-file"\nTLS_INSECURE_SKIP_VERIFY = true\n')
    vsphere = load_settings(
        {
            "PYRIGAUD_CONFIG": str(config),
            "PROVIDER_TYPE": "vsphere",
            "PROVIDER_ENDPOINT": "https://vc/sdk",
            "PROVIDER_DEFAULT_FOLDER": "from-env",
        },
        {"PROVIDER_DEFAULT_CLUSTER": "from-flag"},
        staging_types=STAGING_TYPES,
    )
    assert vsphere.hypervisor == VSphereSettings(
        PROVIDER_DEFAULT_CLUSTER="from-flag",
        PROVIDER_DEFAULT_FOLDER="from-env",
        TLS_INSECURE_SKIP_VERIFY=True,
    )
    fake = load_settings(
        {"PROVIDER_TYPE": "fake", "PYRIGAUD_FAKE_LATENCY": "create=2"}, staging_types=STAGING_TYPES
    )
    assert isinstance(fake.hypervisor, FakeSettings)
    assert fake.hypervisor.latency_by_operation == {"create": 2.0}
    libvirt = load_settings({"LIBVIRT_DOMAIN_TYPE": "QEMU"}, staging_types=STAGING_TYPES).hypervisor
    assert isinstance(libvirt, LibvirtSettings)
    assert libvirt.domain_type == "qemu"


def test_another_hypervisors_settings_are_known_but_not_read(tmp_path: Path) -> None:
    """One config file serves every PROVIDER_TYPE: a name any hypervisor knows is accepted."""
    config = tmp_path / "every.toml"
    config.write_text('LIBVIRT_DOMAIN_TYPE = "xen"\nPROVIDER_DEFAULT_CLUSTER = "c"\n')
    settings = load_settings(
        {"PROVIDER_TYPE": "fake", "PYRIGAUD_CONFIG": str(config)}, staging_types=STAGING_TYPES
    )
    assert settings.hypervisor == FakeSettings()


def test_unknown_keys_in_the_config_file_are_refused(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('PROVIDER_TYP = "fake"\n')
    with pytest.raises(SettingsError, match="PROVIDER_TYP"):
        load_settings({}, config_file=config, staging_types=STAGING_TYPES)


S3_PLACE = {
    "backendType": "s3",
    "storageOptions": {"bucket": "mig", "endpoint": "http://10.0.0.9:9000", "prefix": "lab"},
    "credentialsDir": "/etc/virtrigaud/staging/mig",
}
NFS_PLACE = {
    "backendType": "nfs",
    "storageOptions": {"server": "10.0.0.5", "export": "/export/migrations", "path": "vr"},
}


def test_staging_places_to_sweep_come_as_json_or_as_toml_tables(tmp_path: Path) -> None:
    from_environment = load_settings(
        {"PYRIGAUD_STAGING_SWEEP_PLACES": json.dumps([S3_PLACE, NFS_PLACE])},
        staging_types=STAGING_TYPES,
    )
    config = tmp_path / "places.toml"
    config.write_text(
        "[[PYRIGAUD_STAGING_SWEEP_PLACES]]\n"
        'backendType = "nfs"\n'
        'storageOptions = { server = "10.0.0.5", export = "/export/migrations", path = "vr" }\n'
    )
    from_file = load_settings({}, config_file=config, staging_types=STAGING_TYPES)
    s3, nfs = from_environment.staging_sweep_places
    assert (s3.backend_type, s3.credentials_dir) == ("s3", Path("/etc/virtrigaud/staging/mig"))
    assert nfs == from_file.staging_sweep_places[0]
    assert nfs.storage_options["path"] == "vr"
    assert load_settings({}, staging_types=STAGING_TYPES).staging_sweep_places == ()


@pytest.mark.parametrize(
    ("places", "named"),
    [
        ("[{", "must be a JSON list"),
        ([{**S3_PLACE, "credentialsDir": None}], "credentialsDir: required for s3"),
        ([{**NFS_PLACE, "credentialsDir": "/x"}], "credentialsDir: required for s3, and only"),
        ([{**S3_PLACE, "storageOptions": {"prefix": "lab"}}], "storageOptions.bucket"),
        ([{**NFS_PLACE, "storageOptions": {"server": "h"}}], "storageOptions.export"),
        ([{"backendType": "pvc"}], "backend_type: must be s3 or nfs"),
        ([{"backendType": "ftp"}], "backendType"),
        ([{**NFS_PLACE, "server": "h"}], "server"),
    ],
)
def test_a_staging_place_that_cannot_be_swept_is_refused_at_start_up(
    places: object, named: str
) -> None:
    text = places if isinstance(places, str) else json.dumps(places)
    with pytest.raises(SettingsError, match="PYRIGAUD_STAGING_SWEEP_PLACES") as refused:
        load_settings({"PYRIGAUD_STAGING_SWEEP_PLACES": text}, staging_types=STAGING_TYPES)
    assert named in str(refused.value)
