"""The composition root: the only place that knows which adapter serves which port.

A backend is chosen by configuration (`provider_type`) through a Selector; tests swap
pieces with `container.override(...)` or `container.<provider>.override(...)`.
"""

from __future__ import annotations

from pathlib import Path

from dependency_injector import containers, providers

from pyrigaud.adapters.clocks import SystemClock
from pyrigaud.adapters.credentials.environment import EnvironmentCredentials
from pyrigaud.adapters.credentials.mounted_secret import MountedSecretCredentials
from pyrigaud.adapters.hypervisors.fake.hypervisor import FakeHypervisor
from pyrigaud.application.keyed_lock import KeyedLock
from pyrigaud.application.ownership import OwnershipRule
from pyrigaud.application.ports import Clock, Credentials
from pyrigaud.application.use_cases.capabilities import GetCapabilities
from pyrigaud.application.use_cases.clone_vm import CloneVM
from pyrigaud.application.use_cases.create_vm import CreateVM
from pyrigaud.application.use_cases.delete_vm import DeleteVM
from pyrigaud.application.use_cases.describe_vm import DescribeVM, ListVMs
from pyrigaud.application.use_cases.disks import ExportDisk, GetDiskInfo, ImportDisk
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
from pyrigaud.application.use_cases.validate import ValidateProvider
from pyrigaud.domain.leftovers import LeftoverPolicy
from pyrigaud.domain.models import OwnerMark, Placement
from pyrigaud.entrypoints.grpc.limits import MutationLimiter, rate_limit_of
from pyrigaud.entrypoints.grpc.servicer import ProviderServicer, ProviderUseCases
from pyrigaud.entrypoints.grpc.tls import parse_allowed_sans
from pyrigaud.entrypoints.instrumented import instrument
from pyrigaud.entrypoints.metrics import Metrics
from pyrigaud.entrypoints.settings import Settings


def libvirt_hypervisor(
    endpoint: str,
    clock: Clock,
    domain_type: str,
    default_pool: str,
    allow_loopback_urls: bool,
    *,
    credentials: Credentials,
    metrics: Metrics,
    skip_host_key_verification: bool,
    max_concurrent_calls: int,
    migration_storage_root: Path,
) -> object:
    """The libvirt adapter, imported only when selected: libvirt-python is an optional extra.

    Remote (`qemu+ssh://`, `qemu+libssh://`) endpoints take their SSH key, known_hosts and
    password from `credentials`; each reopen after a lost connection is counted.
    """
    from pyrigaud.adapters.hypervisors.libvirt.connection import (  # noqa: PLC0415
        LibvirtConnection,
    )
    from pyrigaud.adapters.hypervisors.libvirt.hypervisor import (  # noqa: PLC0415
        LibvirtHypervisor,
    )
    from pyrigaud.adapters.hypervisors.libvirt.storage import PoolSettings  # noqa: PLC0415

    return LibvirtHypervisor(
        LibvirtConnection(
            endpoint,
            credentials=credentials,
            verify_host_key=not skip_host_key_verification,
            max_concurrent_calls=max_concurrent_calls,
            on_reconnect=metrics.session_reconnects.labels("libvirt").inc,
        ),
        clock,
        domain_type=domain_type,
        pools=PoolSettings(default_pool=default_pool),
        allow_loopback_urls=allow_loopback_urls,
        migration_storage_root=str(migration_storage_root),
    )


def vsphere_hypervisor(
    endpoint: str,
    credentials: Credentials,
    *,
    insecure: bool,
    datastore: str,
    storage_pod: str,
    cluster: str,
    folder: str,
    metrics: Metrics,
) -> object:
    """The vSphere adapter, imported only when selected: pyvmomi is an optional extra."""
    from pyrigaud.adapters.hypervisors.vsphere.hypervisor import (  # noqa: PLC0415
        vsphere_hypervisor as build,
    )

    defaults = Placement(
        datastore=datastore, storage_pod=storage_pod, cluster=cluster, folder=folder
    )
    on_relogin = metrics.session_reconnects.labels("vsphere").inc
    return build(endpoint, credentials, insecure, defaults, on_relogin=on_relogin)


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


class Container(containers.DeclarativeContainer):
    config = providers.Configuration(strict=True)

    clock = providers.Singleton(SystemClock)
    owner = providers.Singleton(OwnerMark, provider=config.owner_mark)
    name_locks = providers.Singleton(KeyedLock)
    leftovers = providers.Singleton(
        LeftoverPolicy, owner=owner, abandoned_after_seconds=config.abandoned_after_seconds
    )
    metrics = providers.Singleton(Metrics)

    # The hypervisor adapters that log in (libvirt over SSH, vSphere) take their secrets here.
    credentials = providers.Selector(
        config.credentials_source,
        files=providers.Singleton(
            mounted_credentials, directory=config.credentials_dir, metrics=metrics
        ),
        kubernetes=providers.Singleton(
            kubernetes_credentials,
            secret=config.credentials_secret,
            provider_namespace=config.provider_namespace,
            metrics=metrics,
        ),
        env=providers.Singleton(EnvironmentCredentials),
    )

    fake_hypervisor = providers.Singleton(
        FakeHypervisor,
        clock=clock,
        datastores=config.fake_datastores,
        latency=config.fake_latency,
    )

    # One object per backend serves all ports today; a backend that splits them (libvirt,
    # vSphere) adds one Selector per port here, and nothing else changes.
    libvirt_hypervisor = providers.Singleton(
        libvirt_hypervisor,
        endpoint=config.provider_endpoint,
        clock=clock,
        domain_type=config.libvirt_domain_type,
        default_pool=config.default_datastore,
        allow_loopback_urls=config.image_url_allow_loopback,
        credentials=credentials,
        metrics=metrics,
        skip_host_key_verification=config.libvirt_insecure_skip_host_key_verification,
        max_concurrent_calls=config.libvirt_max_concurrent_calls,
        migration_storage_root=config.migration_storage_root,
    )

    vsphere_hypervisor = providers.Singleton(
        vsphere_hypervisor,
        endpoint=config.provider_endpoint,
        credentials=credentials,
        insecure=config.tls_insecure_skip_verify,
        datastore=config.vsphere_default_datastore,
        storage_pod=config.default_storage_pod,
        cluster=config.default_cluster,
        folder=config.default_folder,
        metrics=metrics,
    )

    backend = providers.Selector(
        config.provider_type,
        fake=fake_hypervisor,
        libvirt=libvirt_hypervisor,
        vsphere=vsphere_hypervisor,
    )
    # Every port call is counted and timed (pyrigaud_hypervisor_calls_total and friends).
    hypervisor = providers.Singleton(instrument, backend, metrics)

    ownership = providers.Factory(
        OwnershipRule,
        lifecycle=hypervisor,
        owner=owner,
        clock=clock,
        leftovers=leftovers,
        name_locks=name_locks,
    )
    sweep_leftovers = providers.Factory(
        SweepLeftovers, lifecycle=hypervisor, clock=clock, leftovers=leftovers
    )

    use_cases = providers.Singleton(
        ProviderUseCases,
        validate=providers.Factory(ValidateProvider, health=hypervisor),
        create_vm=providers.Factory(CreateVM, lifecycle=hypervisor, ownership=ownership),
        delete_vm=providers.Factory(DeleteVM, lifecycle=hypervisor),
        power_vm=providers.Factory(PowerVM, power=hypervisor, clock=clock),
        reconfigure_vm=providers.Factory(ReconfigureVM, lifecycle=hypervisor, inventory=hypervisor),
        upgrade_hardware=providers.Factory(
            UpgradeHardware, lifecycle=hypervisor, capabilities=hypervisor
        ),
        describe_vm=providers.Factory(DescribeVM, inventory=hypervisor),
        task_status=providers.Factory(
            TaskStatus, power=hypervisor, tracker=hypervisor, clock=clock
        ),
        create_snapshot=providers.Factory(
            CreateSnapshot, snapshots=hypervisor, capabilities=hypervisor
        ),
        delete_snapshot=providers.Factory(
            DeleteSnapshot, snapshots=hypervisor, capabilities=hypervisor
        ),
        revert_snapshot=providers.Factory(
            RevertSnapshot, snapshots=hypervisor, capabilities=hypervisor
        ),
        clone_vm=providers.Factory(
            CloneVM,
            cloning=hypervisor,
            capabilities=hypervisor,
            ownership=ownership,
        ),
        prepare_image=providers.Factory(PrepareImage, images=hypervisor, capabilities=hypervisor),
        get_capabilities=providers.Factory(GetCapabilities, source=hypervisor),
        export_disk=providers.Factory(ExportDisk, disks=hypervisor, capabilities=hypervisor),
        import_disk=providers.Factory(ImportDisk, disks=hypervisor, capabilities=hypervisor),
        get_disk_info=providers.Factory(GetDiskInfo, disks=hypervisor),
        list_vms=providers.Factory(ListVMs, inventory=hypervisor),
    )

    limiter = providers.Singleton(
        MutationLimiter,
        max_concurrent=config.max_concurrent_ops,
        rate_limit=providers.Factory(rate_limit_of, config.rate_qps, config.rate_burst),
    )
    servicer = providers.Singleton(
        ProviderServicer,
        use_cases=use_cases,
        limiter=limiter,
        clock=clock,
        allowed_sans=providers.Factory(parse_allowed_sans, config.allowed_sans),
        metrics=metrics,
    )


def build_container(settings: Settings, *, mutual_tls: bool = False) -> Container:
    """A container configured from settings (the CLI's and the tests' one way in).

    The SAN allow-list applies only under mutual TLS: on plaintext there is no client
    certificate to check (upstream ignores the list there too; start-up warns about it).
    """
    container = Container()
    container.config.from_dict(
        {
            "provider_type": settings.provider_type,
            "owner_mark": settings.owner_mark,
            "abandoned_after_seconds": settings.abandoned_after_seconds,
            "fake_datastores": (settings.default_datastore or "default",),
            "provider_endpoint": settings.endpoint,
            "default_datastore": settings.default_datastore or "default",
            "libvirt_domain_type": settings.resolved_libvirt_domain_type,
            "libvirt_insecure_skip_host_key_verification": (
                settings.libvirt_insecure_skip_host_key_verification
            ),
            "libvirt_max_concurrent_calls": settings.libvirt_max_concurrent_calls,
            "image_url_allow_loopback": settings.image_url_allow_loopback,
            "migration_storage_root": settings.migration_storage_root,
            "credentials_source": settings.credentials_source,
            "credentials_dir": settings.credentials_dir,
            "credentials_secret": settings.credentials_secret,
            "provider_namespace": settings.provider_namespace,
            "tls_insecure_skip_verify": settings.tls_insecure_skip_verify,
            "vsphere_default_datastore": settings.default_datastore,
            "default_storage_pod": settings.default_storage_pod,
            "default_cluster": settings.default_cluster,
            "default_folder": settings.default_folder,
            "max_concurrent_ops": settings.max_concurrent_ops,
            "rate_qps": settings.rate_qps,
            "rate_burst": settings.rate_burst,
            "allowed_sans": settings.allowed_sans if mutual_tls else "",
            "fake_latency": settings.fake_latency_by_operation,
        }
    )
    return container
