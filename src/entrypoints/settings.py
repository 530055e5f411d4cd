"""Configuration: defaults < config file < environment < command-line flags.

Each setting has one name, the environment variable's (docs/configuration.md). A TOML config file
(`--config` or `PYRIGAUD_CONFIG`) uses the same names as keys, so nothing is spelled twice.

`Settings` are the settings every hypervisor shares; each hypervisor's own are its plugin's
model (`application/hypervisor_plugin.py`), validated from the same merged sources once
PROVIDER_TYPE says which, and carried as `Settings.hypervisor`. A name any registered
hypervisor knows is a known setting whatever the type, so one config file serves them all.

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
from typing import Any, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from returns.result import Failure

from pyrigaud.adapters.staging.patience import STAGING_RETRY_SECONDS
from pyrigaud.adapters.staging.registry import StagingTypes
from pyrigaud.application.hypervisor_plugin import SETTINGS_MODEL
from pyrigaud.application.setting_values import Flag, one_of
from pyrigaud.domain.bounds import MAX_DISK_GIB
from pyrigaud.domain.leftovers import CREATE_DEADLINE_SECONDS, TRANSFER_DEADLINE_SECONDS
from pyrigaud.domain.staging import StagingType
from pyrigaud.domain.staging_gate import StagingGate
from pyrigaud.entrypoints.backends import BACKENDS, DEFAULT, backend_named
from pyrigaud.entrypoints.grpc.wire import field_names as names
from pyrigaud.entrypoints.grpc.wire.field_names import for_the_manager

CREDENTIAL_SOURCES = ("files", "kubernetes", "env")


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

    @field_validator("backend_type")
    @classmethod
    def _a_known_type(cls, value: StagingType, info: ValidationInfo) -> StagingType:
        match _staging_types(info).rules(value):
            case Failure(error):  # this setting names the field itself
                raise ValueError(error.message.removeprefix(f"{error.field}: "))
        return value

    @model_validator(mode="after")
    def _a_place_to_sweep(self, info: ValidationInfo) -> StagingPlaceSetting:
        staging_types = _staging_types(info)
        needs_credentials = self.backend_type in staging_types.taking_credentials()
        if needs_credentials != (self.credentials_dir is not None):
            named = " and ".join(staging_types.taking_credentials())
            raise ValueError(f"credentialsDir: required for {named}, and only for {named}")
        # No credentials yet: they are read from the directory at each sweep.
        match staging_types.parse_place(self.backend_type, self.storage_options, None):
            case Failure(error):  # named as the wire names them, the options as this setting
                message = for_the_manager(error)
                raise ValueError(message.replace(names.STORAGE_OPTIONS, "storageOptions", 1))
        return self


def _staging_types(info: ValidationInfo) -> StagingTypes:
    """The staging types `load_settings` validates the places against (its context)."""
    if not isinstance(info.context, StagingTypes):
        raise TypeError("the settings are validated with the staging types as context")
    return info.context


class Settings(BaseModel):
    model_config = SETTINGS_MODEL

    port: int = Field(9443, alias="PYRIGAUD_PORT", ge=0, le=65535)  # 0: any free port
    health_port: int = Field(8080, alias="PYRIGAUD_HEALTH_PORT", ge=0, le=65535)
    listen_address: str = Field("", alias="PYRIGAUD_LISTEN_ADDRESS")  # "": all interfaces
    provider_type: str = Field(DEFAULT, alias="PROVIDER_TYPE")
    provider_endpoint: str = Field("", alias="PROVIDER_ENDPOINT")
    provider_namespace: str = Field("", alias="PROVIDER_NAMESPACE")
    provider_name: str = Field("", alias="PROVIDER_NAME")
    tls_dir: Path = Field(Path("/etc/virtrigaud/tls"), alias="PYRIGAUD_TLS_DIR")
    tls_enabled: Flag = Field(False, alias="TLS_ENABLED")
    insecure: Flag = Field(False, alias="VIRTRIGAUD_PROVIDER_INSECURE")
    allowed_sans: str = Field("", alias="VIRTRIGAUD_PROVIDER_ALLOWED_SANS")
    credentials_source: str = Field("files", alias="PYRIGAUD_CREDENTIALS")
    credentials_dir: Path = Field(
        Path("/etc/virtrigaud/credentials"), alias="PYRIGAUD_CREDENTIALS_DIR"
    )
    credentials_secret: str = Field("", alias="PYRIGAUD_CREDENTIALS_SECRET")
    # Every hypervisor's: the datastore (storage pool) a placement that names none gets.
    default_datastore: str = Field("", alias="PROVIDER_DEFAULT_DATASTORE")
    image_url_allow_loopback: Flag = Field(False, alias="PYRIGAUD_IMAGE_URL_ALLOW_LOOPBACK")
    # Where a request may aim the staging stores' connections (S3 endpoints, NFS servers).
    staging_allow_loopback: Flag = Field(False, alias="PYRIGAUD_STAGING_ALLOW_LOOPBACK")
    staging_allowed_hosts: str = Field("", alias="PYRIGAUD_STAGING_ALLOWED_HOSTS")
    # Where the manager mounts the PVCs that pvc://<pvc>/<path> URLs of ExportDisk/ImportDisk name.
    migration_storage_root: Path = Field(
        Path("/mnt/migration-storage"), alias="PYRIGAUD_MIGRATION_STORAGE_ROOT"
    )
    # Where disk format conversions keep anonymous scratch files (unset: the temporary directory).
    transfer_scratch_dir: Path | None = Field(None, alias="PYRIGAUD_TRANSFER_SCRATCH_DIR")
    # The largest virtual size a staged image may claim: 62 TiB, what a VMDK holds (a qcow2
    # holds more; a larger disk is no VM's). Checked before anything is made.
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
    log_level: str = Field("info", alias="LOG_LEVEL")
    log_format: str = Field("text", alias="LOG_FORMAT")
    # The selected hypervisor's own settings, its plugin's model, which `load_settings` fills
    # once PROVIDER_TYPE is known (None: that model's defaults). No setting name of its own.
    hypervisor: BaseModel | None = Field(None, exclude=True)

    @field_validator("provider_type")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        return backend_named(value)

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
        return one_of(value, CREDENTIAL_SOURCES, default="files")

    @model_validator(mode="after")
    def _secret_named_for_kubernetes(self) -> Settings:
        if self.credentials_source == "kubernetes" and not self.credentials_secret:
            raise ValueError(
                "PYRIGAUD_CREDENTIALS_SECRET is required when PYRIGAUD_CREDENTIALS=kubernetes"
            )
        return self

    @property
    def endpoint(self) -> str:
        """PROVIDER_ENDPOINT, else the selected hypervisor's default."""
        return self.provider_endpoint or BACKENDS[self.provider_type].default_endpoint

    @property
    def scratch_dir(self) -> str | None:
        """PYRIGAUD_TRANSFER_SCRATCH_DIR as the adapters take it (None: the temporary directory)."""
        return str(self.transfer_scratch_dir) if self.transfer_scratch_dir else None

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


def setting_names(model: type[BaseModel]) -> set[str]:
    """The settings a model reads: its fields' aliases, the environment variables' names."""
    return {field.alias for field in model.model_fields.values() if field.alias}


def known_setting_names() -> set[str]:
    """Every setting a config file or flag may name: the common ones and every registered
    hypervisor's, whichever is selected."""
    return setting_names(Settings).union(
        *(setting_names(plugin.settings) for plugin in BACKENDS.values())
    )


def load_settings(
    environ: Mapping[str, str],
    overrides: Mapping[str, Any] | None = None,
    config_file: Path | None = None,
    *,
    staging_types: StagingTypes,
) -> Settings:
    """Merge the sources; `overrides` are command-line flags, keyed by setting name. The common
    settings are checked first (the sweep's places against `staging_types`, the composition
    root's), then the selected hypervisor's own; another hypervisor's settings are known but
    not read."""
    names = known_setting_names()
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
    hypervisors_own = names - setting_names(Settings)
    settings = _validated(
        Settings,
        {name: value for name, value in values.items() if name not in hypervisors_own},
        context=staging_types,
    )
    plugin = BACKENDS[settings.provider_type]
    own = setting_names(plugin.settings)
    hypervisor = _validated(
        plugin.settings,
        {name: value for name, value in values.items() if name in own},
        context=settings,
    )
    return settings.model_copy(update={"hypervisor": hypervisor})


_Model = TypeVar("_Model", bound=BaseModel)


def _validated(model: type[_Model], values: Mapping[str, Any], context: object = None) -> _Model:
    """`model` from `values`, or SettingsError naming each setting that cannot run."""
    try:
        return model.model_validate(values, context=context)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in item['loc'])}: {item['msg']}"
            for item in error.errors()
        )
        raise SettingsError(problems) from None
