"""The composition root: the only place that knows which adapter serves which port.

The typed `Settings` go in as they are. The backend is built through the registry
(`backends.py`) from PROVIDER_TYPE; each of its ports is instrumented, and each use case is
wired from the port it needs (`use_cases.py`). Tests swap pieces with
`container.<provider>.override(...)`, e.g. `container.backend` for a fake backend of their own.
"""

from __future__ import annotations

from pathlib import Path

from dependency_injector import containers, providers

from pyrigaud.adapters.clocks import SystemClock
from pyrigaud.adapters.credentials.environment import EnvironmentCredentials
from pyrigaud.adapters.credentials.mounted_secret import MountedSecretCredentials
from pyrigaud.adapters.disk_images.inspection import InspectingJudge
from pyrigaud.adapters.staging.gate import ResolvingGate
from pyrigaud.adapters.staging.registry import StagingPlace, staging_by_backend
from pyrigaud.application.keyed_lock import KeyedLock
from pyrigaud.application.ownership import OwnershipRule
from pyrigaud.application.ports import Clock
from pyrigaud.application.ports.staging import StagingBackends
from pyrigaud.application.use_cases.sweep_leftovers import SweepLeftovers
from pyrigaud.domain.leftovers import LeftoverPolicy
from pyrigaud.domain.models import OwnerMark
from pyrigaud.entrypoints.backends import BackendServices, build_backend
from pyrigaud.entrypoints.grpc.interceptors import provider_layers
from pyrigaud.entrypoints.grpc.limits import MutationLimiter, rate_limit_of
from pyrigaud.entrypoints.grpc.server import ProviderService
from pyrigaud.entrypoints.grpc.servicer import provider_rpcs
from pyrigaud.entrypoints.grpc.tls import parse_allowed_sans
from pyrigaud.entrypoints.instrumented import instrument_backend
from pyrigaud.entrypoints.metrics import Metrics, PrometheusTransfers
from pyrigaud.entrypoints.settings import Settings
from pyrigaud.entrypoints.use_cases import provider_use_cases


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


def staging_of(settings: Settings, clock: Clock) -> StagingBackends:
    """Where ExportDisk/ImportDisk stage disks (the mounted PVCs, S3 and NFS as installed),
    and the places the leftover sweep visits besides the PVCs, their credentials read from
    their mounted Secret at each visit."""
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
    return staging_by_backend(
        settings.owner_mark, clock, str(settings.migration_storage_root), places
    )


def allowed_sans_of(settings: Settings, mutual_tls: bool) -> frozenset[str]:
    """The SAN allow-list applies only under mutual TLS: on plaintext there is no client
    certificate to check (upstream ignores the list there too; start-up warns about it)."""
    return parse_allowed_sans(settings.allowed_sans) if mutual_tls else frozenset()


class Container(containers.DeclarativeContainer):
    settings = providers.Dependency(instance_of=Settings)
    mutual_tls = providers.Object(False)

    clock = providers.Singleton(SystemClock)
    metrics = providers.Singleton(Metrics)
    owner = providers.Singleton(OwnerMark, provider=settings.provided.owner_mark)
    name_locks = providers.Singleton(KeyedLock)
    leftovers = providers.Singleton(
        LeftoverPolicy,
        owner=owner,
        abandoned_after_seconds=settings.provided.abandoned_after_seconds,
        transfer_abandoned_after_seconds=settings.provided.transfer_abandoned_after_seconds,
    )

    # The hypervisor adapters that log in (libvirt over SSH, vSphere) take their secrets here.
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

    # The selected backend's ports (the registry imports only that backend's package), each
    # port counted and timed (pyrigaud_hypervisor_calls_total and friends).
    staging = providers.Singleton(staging_of, settings, clock)
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
            metrics=metrics,
            staging=staging,
            image_judge=image_judge,
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
            PrometheusTransfers, metrics, settings.provided.provider_type
        ),
        storage_gate=providers.Singleton(ResolvingGate, settings.provided.staging_gate),
    )

    limiter = providers.Singleton(
        MutationLimiter,
        max_concurrent=settings.provided.max_concurrent_ops,
        rate_limit=providers.Factory(
            rate_limit_of, settings.provided.rate_qps, settings.provided.rate_burst
        ),
    )
    rpcs = providers.Singleton(provider_rpcs, use_cases, clock)
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


def build_container(settings: Settings, *, mutual_tls: bool = False) -> Container:
    """A container for these settings (the CLI's and the tests' one way in)."""
    return Container(settings=settings, mutual_tls=providers.Object(mutual_tls))
