"""The composition root: the only place that knows which adapter serves which port, and what
makes up the running provider (the gRPC server with its TLS, the health and metrics endpoint,
the leftover sweeper; `bootstrap.py` starts and stops them).

The typed `Settings` go in as they are. The backend is built through the registry
(`backends.py`) from PROVIDER_TYPE; each of its ports is instrumented, and each use case is
wired from the port it needs (`provider_use_cases`; a port the backend lacks leaves its use
cases answering UNSUPPORTED). Every clock is `clock` (no adapter makes one), so overriding it
reaches every piece that reads time; the wire and the stores read the staging types from
`staging_types` (the settings, loaded before the container is built, are validated against
the same provider's object by `load_settings`). Tests swap pieces through `bootstrap`'s
overrides, or with `container.<provider>.override(...)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import grpc
from dependency_injector import containers, providers

from pyrigaud.adapters.clocks import SystemClock
from pyrigaud.adapters.credentials.environment import EnvironmentCredentials
from pyrigaud.adapters.credentials.mounted_secret import MountedSecretCredentials
from pyrigaud.adapters.disk_images.inspection import InspectingJudge
from pyrigaud.adapters.staging.gate import ResolvingGate
from pyrigaud.adapters.staging.registry import STAGING_TYPES, StagingPlace, StagingTypes
from pyrigaud.application.backend import Backend
from pyrigaud.application.hardware_manifest import MANIFEST_SUFFIX
from pyrigaud.application.hypervisor_plugin import BackendServices
from pyrigaud.application.keyed_lock import KeyedLock
from pyrigaud.application.ownership import OwnershipRule
from pyrigaud.application.ports import Clock
from pyrigaud.application.ports.image_judge import ImageJudge
from pyrigaud.application.ports.staging import StagingStores
from pyrigaud.application.ports.storage_gate import StorageGate
from pyrigaud.application.ports.transfer_metrics import TransferMetrics
from pyrigaud.application.provider import ProviderUseCases, Unsupported
from pyrigaud.application.timed_ports import instrument_backend
from pyrigaud.application.use_cases.capabilities import GetCapabilities, TransferClaims
from pyrigaud.application.use_cases.clone_vm import CloneVM
from pyrigaud.application.use_cases.create_vm import CreateVM
from pyrigaud.application.use_cases.delete_vm import DeleteVM
from pyrigaud.application.use_cases.describe_vm import DescribeVM, ListVMs
from pyrigaud.application.use_cases.disks import GetDiskInfo
from pyrigaud.application.use_cases.export_disk import ExportDisk
from pyrigaud.application.use_cases.import_disk import ImportDisk
from pyrigaud.application.use_cases.power_vm import PowerVM
from pyrigaud.application.use_cases.prepare_image import PrepareImage
from pyrigaud.application.use_cases.reconfigure_vm import ReconfigureVM, UpgradeHardware
from pyrigaud.application.use_cases.snapshots import (
    CreateSnapshot,
    DeleteSnapshot,
    RevertSnapshot,
)
from pyrigaud.application.use_cases.sweep_leftovers import SweepLeftovers
from pyrigaud.application.use_cases.task_status import TaskStatus
from pyrigaud.application.use_cases.transfers import TransferContext
from pyrigaud.application.use_cases.validate import ValidateProvider
from pyrigaud.domain.leftovers import LeftoverPolicy
from pyrigaud.domain.models import OwnerMark
from pyrigaud.entrypoints.backends import build_backend
from pyrigaud.entrypoints.grpc.interceptors import provider_layers
from pyrigaud.entrypoints.grpc.limits import MutationLimiter, rate_limit_of
from pyrigaud.entrypoints.grpc.server import ProviderServer, ProviderService
from pyrigaud.entrypoints.grpc.servicer import provider_rpcs
from pyrigaud.entrypoints.grpc.tls import TlsSettings, parse_allowed_sans, server_credentials
from pyrigaud.entrypoints.http.health import HealthServer, Readiness
from pyrigaud.entrypoints.metrics import Metrics, PrometheusHypervisorCounters, PrometheusTransfers
from pyrigaud.entrypoints.settings import Settings
from pyrigaud.entrypoints.sweeper import LeftoverSweeper

_Port = TypeVar("_Port")
_UseCase = TypeVar("_UseCase")


def _served(
    port: _Port | None, what: str, use_case: Callable[[_Port], _UseCase]
) -> _UseCase | Unsupported:
    return Unsupported(what) if port is None else use_case(port)


def provider_use_cases(
    backend: Backend,
    clock: Clock,
    ownership: OwnershipRule,
    *,
    staging: StagingStores,
    judge: ImageJudge,
    leftovers: LeftoverPolicy,
    transfer_metrics: TransferMetrics,
    storage_gate: StorageGate,
) -> ProviderUseCases:
    """`staging` is where disks move through (`storage_gate` says which of its stores a
    request may name; the capabilities claim the types whose store it built), `judge` tells
    a staged image's format, `leftovers` when a transfer's staged temporaries count as
    abandoned, and `transfer_metrics` what an operator sees of transfers."""
    caps = TransferClaims(backend.capabilities, staging.types)
    transfers = TransferContext(
        staging,
        storage_gate,
        clock,
        abandoned_after_seconds=leftovers.transfer_abandoned_after_seconds,
        metrics=transfer_metrics,
    )
    return ProviderUseCases(
        validate=ValidateProvider(backend.health),
        create_vm=CreateVM(backend.lifecycle, ownership, hardware=backend.hardware),
        delete_vm=DeleteVM(backend.lifecycle),
        power_vm=PowerVM(backend.power, clock),
        reconfigure_vm=ReconfigureVM(backend.lifecycle, backend.inventory),
        upgrade_hardware=UpgradeHardware(backend.lifecycle, caps),
        describe_vm=DescribeVM(backend.inventory),
        task_status=TaskStatus(backend.power, backend.tasks, clock),
        create_snapshot=_served(backend.snapshots, "snapshots", lambda p: CreateSnapshot(p, caps)),
        delete_snapshot=_served(backend.snapshots, "snapshots", lambda p: DeleteSnapshot(p, caps)),
        revert_snapshot=_served(backend.snapshots, "snapshots", lambda p: RevertSnapshot(p, caps)),
        clone_vm=_served(backend.cloning, "cloning", lambda p: CloneVM(p, caps, ownership)),
        prepare_image=_served(
            backend.images, "image import (ImagePrepare)", lambda p: PrepareImage(p, caps)
        ),
        get_capabilities=GetCapabilities(caps),
        export_disk=_served(
            backend.disk_transfer,
            "disk export",
            lambda p: ExportDisk(p, caps, transfers, hardware=backend.hardware),
        ),
        import_disk=_served(
            backend.disk_transfer, "disk import", lambda p: ImportDisk(p, judge, caps, transfers)
        ),
        get_disk_info=_served(backend.disk_transfer, "disk transfer", GetDiskInfo),
        list_vms=ListVMs(backend.inventory),
    )


def mounted_credentials(directory: Path, metrics: Metrics) -> MountedSecretCredentials:
    on_reload = metrics.credential_reloads.labels("files").inc
    return MountedSecretCredentials(directory, on_reload)


def kubernetes_credentials(secret: str, provider_namespace: str, metrics: Metrics) -> object:
    """The Kubernetes API adapter, imported only when selected (an optional extra)."""
    from pyrigaud.adapters.credentials.kubernetes_secret import (  # noqa: PLC0415
        kubernetes_secret_credentials,
    )

    on_reload = metrics.credential_reloads.labels("kubernetes").inc
    return kubernetes_secret_credentials(secret, provider_namespace, on_reload)


def staging_of(
    settings: Settings, staging_types: StagingTypes, clock: Clock, metrics: Metrics
) -> StagingStores:
    """Where ExportDisk/ImportDisk stage disks (the mounted PVCs, S3 and NFS as installed),
    and the places the leftover sweep visits besides the PVCs, their credentials read from
    their mounted Secret at each visit; its deferred aborts counted. The sweeps also remove a
    hardware manifest whose staged disk is gone: the manager removes the disk, never the
    manifest an export wrote beside it."""
    places = [
        StagingPlace(
            place.backend_type,
            place.storage_options,
            MountedSecretCredentials(place.credentials_dir).current
            if place.credentials_dir
            else dict,
        )
        for place in settings.staging_sweep_places
    ]
    staging = staging_types.stores(
        settings.owner_mark,
        clock,
        str(settings.migration_storage_root),
        places,
        retry_seconds=settings.staging_retry_seconds,
        companion_suffixes=(MANIFEST_SUFFIX,),
    )
    metrics.watch_deferred_aborts(staging.deferred_aborts)
    return staging


@dataclass(frozen=True)
class ServerTransport:
    """The gRPC server's TLS; None is plaintext (a Singleton provider cannot hold a bare None:
    it would be made again, and warn again, at every use)."""

    credentials: grpc.ServerCredentials | None

    @property
    def mutual_tls(self) -> bool:
        return self.credentials is not None


def server_transport_of(settings: Settings) -> ServerTransport:
    """The gRPC server's TLS as the settings ask; TransportSecurityError when the settings or
    the mounted files cannot make it."""
    return ServerTransport(
        server_credentials(
            TlsSettings(
                tls_dir=settings.tls_dir,
                tls_enabled=settings.tls_enabled,
                insecure_allowed=settings.insecure,
                allowed_sans=parse_allowed_sans(settings.allowed_sans),
            )
        )
    )


def allowed_sans_of(settings: Settings, mutual_tls: bool) -> frozenset[str]:
    """The SAN allow-list applies only under mutual TLS: on plaintext there is no client
    certificate to check (upstream ignores the list there too; start-up warns about it)."""
    return parse_allowed_sans(settings.allowed_sans) if mutual_tls else frozenset()


class Container(containers.DeclarativeContainer):
    settings = providers.Dependency(instance_of=Settings)
    server_transport = providers.Singleton(server_transport_of, settings)
    mutual_tls = server_transport.provided.mutual_tls

    clock = providers.Singleton(SystemClock)
    staging_types = providers.Object(STAGING_TYPES)  # what the wire and the stores know
    metrics = providers.Singleton(Metrics)
    owner = providers.Singleton(OwnerMark, provider=settings.provided.owner_mark)
    name_locks = providers.Singleton(KeyedLock)
    leftovers = providers.Singleton(
        LeftoverPolicy,
        owner=owner,
        abandoned_after_seconds=settings.provided.abandoned_after_seconds,
        transfer_abandoned_after_seconds=settings.provided.transfer_abandoned_after_seconds,
    )

    # The hypervisor adapters that log in (over SSH, to an API) take their secrets here.
    credentials = providers.Selector(
        settings.provided.credentials_source,
        files=providers.Singleton(
            mounted_credentials, directory=settings.provided.credentials_dir, metrics=metrics
        ),
        kubernetes=providers.Singleton(
            kubernetes_credentials,
            secret=settings.provided.credentials_secret,
            provider_namespace=settings.provided.provider_namespace,
            metrics=metrics,
        ),
        env=providers.Singleton(EnvironmentCredentials),
    )

    # The selected backend's ports (only its builder imports its hypervisor's library), each
    # port counted and timed (pyrigaud_hypervisor_calls_total and friends).
    staging = providers.Singleton(staging_of, settings, staging_types, clock, metrics)
    image_judge = providers.Singleton(
        InspectingJudge, max_virtual_bytes=settings.provided.max_image_virtual_bytes
    )
    backend = providers.Singleton(
        build_backend,
        settings,
        providers.Factory(
            BackendServices,
            clock=clock,
            credentials=credentials.provider,
            image_judge=image_judge,
            counters=providers.Factory(
                PrometheusHypervisorCounters, metrics, settings.provided.provider_type
            ),
        ),
    )
    ports = providers.Singleton(instrument_backend, backend, metrics)

    ownership = providers.Factory(
        OwnershipRule,
        lifecycle=ports.provided.lifecycle,
        owner=owner,
        clock=clock,
        leftovers=leftovers,
        name_locks=name_locks,
    )
    sweep_leftovers = providers.Factory(
        SweepLeftovers,
        lifecycle=ports.provided.lifecycle,
        clock=clock,
        leftovers=leftovers,
        transfers=ports.provided.transfer_leftovers,
        staging=staging,
    )
    use_cases = providers.Singleton(
        provider_use_cases,
        backend=ports,
        clock=clock,
        ownership=ownership,
        staging=staging,
        judge=image_judge,
        leftovers=leftovers,
        transfer_metrics=providers.Singleton(
            PrometheusTransfers, metrics, settings.provided.provider_type, staging.provided.types
        ),
        storage_gate=providers.Singleton(ResolvingGate, settings.provided.staging_gate),
    )

    limiter = providers.Singleton(
        MutationLimiter,
        max_concurrent=settings.provided.max_concurrent_ops,
        rate_limit=providers.Factory(
            rate_limit_of, settings.provided.rate_qps, settings.provided.rate_burst, clock
        ),
        clock=clock,
    )
    rpcs = providers.Singleton(provider_rpcs, use_cases, clock, staging_types)
    servicer = providers.Singleton(
        ProviderService,
        rpcs=rpcs,
        layers=providers.Singleton(
            provider_layers,
            metrics,
            limiter,
            providers.Factory(allowed_sans_of, settings, mutual_tls),
        ),
    )

    readiness = providers.Singleton(Readiness, settings.provided.provider_type)
    grpc_server = providers.Singleton(
        ProviderServer,
        servicer,
        settings.provided.grpc_bind,
        server_transport.provided.credentials,
        settings.provided.grpc_workers,
    )
    health_server = providers.Singleton(
        HealthServer,
        settings.provided.listen_address,
        settings.provided.health_port,
        readiness,
        metrics,
    )
    sweeper = providers.Singleton(
        LeftoverSweeper, sweep_leftovers, settings.provided.sweep_interval_seconds
    )
