"""Configuration: defaults < config file < environment < command-line flags.

Each setting has one name, the environment variable's (docs/configuration.md). A TOML config file
(`--config` or `PYRIGAUD_CONFIG`) uses the same names as keys, so nothing is spelled twice.

The merge is `load_settings`' few lines rather than pydantic-settings (checked with 2.16.3):
its environment source reads only `os.environ`, while `load_settings` takes the environment as
an argument (the CLI passes `os.environ`, tests a dict), and its TOML source skips a missing
file silently, which must be an error here; it would also add ~80 ms to start-up imports.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from returns.result import Failure

from pyrigaud.adapters.staging.patience import STAGING_RETRY_SECONDS
from pyrigaud.domain.bounds import MAX_DISK_GIB
from pyrigaud.domain.leftovers import CREATE_DEADLINE_SECONDS, TRANSFER_DEADLINE_SECONDS
from pyrigaud.domain.staging import OPTIONS, StagingType, parse_staging_place
from pyrigaud.domain.staging_gate import StagingGate
from pyrigaud.entrypoints.backends import ALIASES, BACKENDS

LIBVIRT_DOMAIN_TYPES = ("auto", "kvm", "qemu", "test")
CREDENTIAL_SOURCES = ("files", "kubernetes", "env")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class SettingsError(Exception):
    """Configuration that cannot run; the message says which setting and why."""


class StagingPlaceSetting(BaseModel):
    """A staging place the leftover sweep visits (PYRIGAUD_STAGING_SWEEP_PLACES): the
    manager's backend type and storage options for it, as a VMMigration's storage names them,
    and for S3 the directory where the Secret holding its credentials is mounted."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    backend_type: StagingType = Field(alias="backendType")
    storage_options: dict[str, object] = Field(default_factory=dict, alias="storageOptions")
    credentials_dir: Path | None = Field(None, alias="credentialsDir")

    @model_validator(mode="after")
    def _a_place_to_sweep(self) -> StagingPlaceSetting:
        needs_credentials = self.backend_type is StagingType.S3
        if needs_credentials != (self.credentials_dir is not None):
            raise ValueError("credentialsDir: required for s3, and only for s3")
        # Stand-in credentials: the real ones are read from the directory at each sweep.
        stand_in = {"accessKeyID": "-", "secretAccessKey": "-"} if needs_credentials else {}
        match parse_staging_place(self.backend_type, self.storage_options, stand_in):
            case Failure(error):  # named as this setting spells the options
                raise ValueError(error.message.replace(OPTIONS, "storageOptions", 1))
        return self


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    port: int = Field(9443, alias="PYRIGAUD_PORT", ge=0, le=65535)  # 0: any free port
    health_port: int = Field(8080, alias="PYRIGAUD_HEALTH_PORT", ge=0, le=65535)
    listen_address: str = Field("", alias="PYRIGAUD_LISTEN_ADDRESS")  # "": all interfaces
    provider_type: str = Field("libvirt", alias="PROVIDER_TYPE")  # on test:///default
    provider_endpoint: str = Field("", alias="PROVIDER_ENDPOINT")
    provider_namespace: str = Field("", alias="PROVIDER_NAMESPACE")
    provider_name: str = Field("", alias="PROVIDER_NAME")
    tls_dir: Path = Field(Path("/etc/virtrigaud/tls"), alias="PYRIGAUD_TLS_DIR")
    tls_enabled: bool = Field(False, alias="TLS_ENABLED")
    insecure: bool = Field(False, alias="VIRTRIGAUD_PROVIDER_INSECURE")
    allowed_sans: str = Field("", alias="VIRTRIGAUD_PROVIDER_ALLOWED_SANS")
    credentials_source: str = Field("files", alias="PYRIGAUD_CREDENTIALS")
    credentials_dir: Path = Field(
        Path("/etc/virtrigaud/credentials"), alias="PYRIGAUD_CREDENTIALS_DIR"
    )
    credentials_secret: str = Field("", alias="PYRIGAUD_CREDENTIALS_SECRET")
    default_datastore: str = Field("", alias="PROVIDER_DEFAULT_DATASTORE")
    default_storage_pod: str = Field("", alias="PROVIDER_DEFAULT_STORAGE_POD")
    default_cluster: str = Field("", alias="PROVIDER_DEFAULT_CLUSTER")
    default_folder: str = Field("", alias="PROVIDER_DEFAULT_FOLDER")
    tls_insecure_skip_verify: bool = Field(False, alias="TLS_INSECURE_SKIP_VERIFY")
    libvirt_domain_type: str = Field("auto", alias="LIBVIRT_DOMAIN_TYPE")
    libvirt_insecure_skip_host_key_verification: bool = Field(
        False, alias="LIBVIRT_INSECURE_SKIP_HOST_KEY_VERIFICATION"
    )
    # Every libvirt call, reads included (PYRIGAUD_MAX_CONCURRENT_OPS bounds mutations only).
    libvirt_max_concurrent_calls: int = Field(
        64, alias="LIBVIRT_MAX_CONCURRENT_CALLS", ge=1, le=4096
    )
    image_url_allow_loopback: bool = Field(False, alias="PYRIGAUD_IMAGE_URL_ALLOW_LOOPBACK")
    # Where a request may aim the staging stores' connections (S3 endpoints, NFS servers).
    staging_allow_loopback: bool = Field(False, alias="PYRIGAUD_STAGING_ALLOW_LOOPBACK")
    staging_allowed_hosts: str = Field("", alias="PYRIGAUD_STAGING_ALLOWED_HOSTS")
    # Where the manager mounts the PVCs that pvc://<pvc>/<path> URLs of ExportDisk/ImportDisk name.
    migration_storage_root: Path = Field(
        Path("/mnt/migration-storage"), alias="PYRIGAUD_MIGRATION_STORAGE_ROOT"
    )
    # Where disk format conversions keep anonymous scratch files (unset: the temporary directory).
    transfer_scratch_dir: Path | None = Field(None, alias="PYRIGAUD_TRANSFER_SCRATCH_DIR")
    # The largest virtual size a staged image may claim: 62 TiB, what a vSphere disk holds (a
    # qcow2 on libvirt holds more; a larger disk is no VM's). Checked before anything is made.
    max_image_virtual_gib: int = Field(
        62 * 1024, alias="PYRIGAUD_MAX_IMAGE_VIRTUAL_GIB", ge=1, le=MAX_DISK_GIB
    )
    grpc_workers: int = Field(32, alias="PYRIGAUD_GRPC_WORKERS", ge=2, le=1024)
    max_concurrent_ops: int = Field(8, alias="PYRIGAUD_MAX_CONCURRENT_OPS", ge=1, le=1024)
    rate_qps: float = Field(0.0, alias="PYRIGAUD_RATE_QPS", ge=0, le=10000)  # 0: no rate limit
    rate_burst: int = Field(20, alias="PYRIGAUD_RATE_BURST", ge=1, le=10000)
    # A Create's building mark older than this is a crash leftover (docs/operating.md: the
    # Create deadline); tests shorten it.
    abandoned_after_seconds: float = Field(
        CREATE_DEADLINE_SECONDS, alias="PYRIGAUD_ABANDONED_AFTER_SECONDS", ge=0
    )
    # A disk transfer's temporaries older than this are leftovers of a dead transfer.
    transfer_abandoned_after_seconds: float = Field(
        2 * TRANSFER_DEADLINE_SECONDS, alias="PYRIGAUD_TRANSFER_ABANDONED_AFTER_SECONDS", ge=0
    )
    sweep_interval_seconds: float = Field(300.0, alias="PYRIGAUD_SWEEP_INTERVAL_SECONDS", gt=0)
    # How long an S3 or NFS transfer waits out a store that stopped answering, per part, read
    # or write, before it answers UNAVAILABLE (docs/staging-resilience.md); 0: not at all.
    staging_retry_seconds: float = Field(
        STAGING_RETRY_SECONDS, alias="PYRIGAUD_STAGING_RETRY_SECONDS", ge=0, le=600
    )
    # S3 buckets and NFS exports the sweep visits besides the mounted PVCs (a JSON list).
    staging_sweep_places: tuple[StagingPlaceSetting, ...] = Field(
        (), alias="PYRIGAUD_STAGING_SWEEP_PLACES"
    )
    shutdown_grace_seconds: float = Field(15.0, alias="PYRIGAUD_SHUTDOWN_GRACE_SECONDS", ge=0)
    fake_latency: str = Field("", alias="PYRIGAUD_FAKE_LATENCY")  # "create=2,describe=0.01"
    log_level: str = Field("info", alias="LOG_LEVEL")
    log_format: str = Field("text", alias="LOG_FORMAT")

    @field_validator("provider_type")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        backend = _one_of(value, (*BACKENDS, *ALIASES), default="libvirt")
        return ALIASES.get(backend, backend)

    @field_validator(
        "tls_enabled",
        "insecure",
        "image_url_allow_loopback",
        "staging_allow_loopback",
        "tls_insecure_skip_verify",
        "libvirt_insecure_skip_host_key_verification",
        mode="before",
    )
    @classmethod
    def _boolean(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip().lower()
            if text in _TRUE:
                return True
            if text in _FALSE:
                return False
            raise ValueError(f"must be true or false, got {value!r}")
        return value

    @field_validator("staging_sweep_places", mode="before")
    @classmethod
    def _places_list(cls, value: object) -> object:
        """The environment gives a JSON list; a config file, a TOML array of tables."""
        if isinstance(value, str):
            try:
                return json.loads(value) if value.strip() else ()
            except json.JSONDecodeError as error:
                raise ValueError(f"must be a JSON list of places: {error}") from None
        return value

    @field_validator("credentials_source")
    @classmethod
    def _known_credentials_source(cls, value: str) -> str:
        return _one_of(value, CREDENTIAL_SOURCES, default="files")

    @model_validator(mode="after")
    def _endpoint_for_vsphere(self) -> Settings:
        if self.provider_type == "vsphere" and not self.provider_endpoint:
            raise ValueError("PROVIDER_ENDPOINT (https://vcenter/sdk) is required for vsphere")
        return self

    @model_validator(mode="after")
    def _secret_named_for_kubernetes(self) -> Settings:
        if self.credentials_source == "kubernetes" and not self.credentials_secret:
            raise ValueError(
                "PYRIGAUD_CREDENTIALS_SECRET is required when PYRIGAUD_CREDENTIALS=kubernetes"
            )
        return self

    @field_validator("libvirt_domain_type")
    @classmethod
    def _known_domain_type(cls, value: str) -> str:
        return _one_of(value, LIBVIRT_DOMAIN_TYPES, default="auto")

    @field_validator("fake_latency")
    @classmethod
    def _latency_pairs(cls, value: str) -> str:
        fake_latencies(value)
        return value

    @property
    def fake_latency_by_operation(self) -> dict[str, float]:
        return fake_latencies(self.fake_latency)

    @property
    def endpoint(self) -> str:
        """PROVIDER_ENDPOINT, else the backend's embedded default (libvirt: the test driver)."""
        return self.provider_endpoint or BACKENDS[self.provider_type].default_endpoint

    @field_validator("staging_allowed_hosts")
    @classmethod
    def _staging_networks(cls, value: str) -> str:
        """Each entry an IP address or network, checked now: a typo refuses start-up."""
        StagingGate(allowed_networks=_comma_list(value))
        return value

    @property
    def staging_gate(self) -> StagingGate:
        return StagingGate(
            allow_loopback=self.staging_allow_loopback,
            allowed_networks=_comma_list(self.staging_allowed_hosts),
        )

    @property
    def max_image_virtual_bytes(self) -> int:
        return self.max_image_virtual_gib * 1024**3

    @property
    def owner_mark(self) -> str:
        """Who this provider is, stamped on every VM it makes (shared by its replicas)."""
        if self.provider_namespace and self.provider_name:
            return f"{self.provider_namespace}/{self.provider_name}"
        return self.provider_name or "pyrigaud"

    @property
    def grpc_bind(self) -> str:
        host = self.listen_address or "[::]"
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"{host}:{self.port}"


def _comma_list(value: str) -> tuple[str, ...]:
    return tuple(entry.strip() for entry in value.split(",") if entry.strip())


def _one_of(value: str, choices: tuple[str, ...], *, default: str) -> str:
    """A case-insensitive choice; empty means the default."""
    choice = value.strip().lower() or default
    if choice not in choices:
        raise ValueError(f"must be one of {', '.join(choices)}, got {value!r}")
    return choice


def fake_latencies(text: str) -> dict[str, float]:
    """`operation=seconds,...` for the fake backend's latency injection (demos, load tests)."""
    latencies: dict[str, float] = {}
    for pair in filter(None, (part.strip() for part in text.split(","))):
        operation, _, seconds = pair.partition("=")
        try:
            latencies[operation.strip()] = float(seconds)
        except ValueError:
            raise ValueError(f"expected operation=seconds, got {pair!r}") from None
    return latencies


def _names() -> set[str]:
    return {str(field.alias) for field in Settings.model_fields.values()}


def load_settings(
    environ: Mapping[str, str],
    overrides: Mapping[str, Any] | None = None,
    config_file: Path | None = None,
) -> Settings:
    """Merge the sources; `overrides` are command-line flags, keyed by setting name."""
    names = _names()
    values: dict[str, Any] = {}
    path = config_file or (
        Path(environ["PYRIGAUD_CONFIG"]) if environ.get("PYRIGAUD_CONFIG") else None
    )
    if path is not None:
        try:
            document = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as error:
            raise SettingsError(f"config file {path}: {error}") from None
        unknown = sorted(set(document) - names)
        if unknown:
            raise SettingsError(f"config file {path}: unknown settings {', '.join(unknown)}")
        values.update(document)
    values.update({name: value for name, value in environ.items() if name in names})
    values.update({name: value for name, value in (overrides or {}).items() if value is not None})
    try:
        return Settings.model_validate(values)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in item['loc'])}: {item['msg']}"
            for item in error.errors()
        )
        raise SettingsError(problems) from None
