"""The backend registry: PROVIDER_TYPE -> how to build that backend's ports from the settings.

Adding a backend is one package under `adapters/hypervisors/` with a `backend.py` builder, one
entry here, and one extra in pyproject.toml. A backend's package is imported only when it is
selected, so its optional dependencies (libvirt-python, pyvmomi) are needed only then.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyrigaud.application.backend import Backend
from pyrigaud.application.ports import Clock, Credentials
from pyrigaud.application.ports.image_judge import ImageJudge
from pyrigaud.application.ports.staging import StagingStores
from pyrigaud.domain.models import Placement
from pyrigaud.entrypoints.metrics import Metrics

if TYPE_CHECKING:
    from pyrigaud.entrypoints.settings import Settings


@dataclass(frozen=True)
class BackendServices:
    """What the container offers a builder; credentials are opened only by a builder that
    logs in (`credentials()`), so the fake never reads a Secret."""

    clock: Clock
    credentials: Callable[[], Credentials]
    metrics: Metrics
    staging: StagingStores  # where ExportDisk/ImportDisk stage disks (what to advertise)
    image_judge: ImageJudge  # judges every untrusted image before a byte is stored


@dataclass(frozen=True)
class BackendEntry:
    build: Callable[[Settings, BackendServices], Backend]
    extra: str | None  # the pyproject extra its dependencies come with
    default_endpoint: str = ""


def _fake(settings: Settings, services: BackendServices) -> Backend:
    from pyrigaud.adapters.hypervisors.fake.backend import build_fake_backend  # noqa: PLC0415

    return build_fake_backend(
        services.clock,
        datastores=(settings.default_datastore or "default",),
        latency=settings.fake_latency_by_operation,
    )


def _libvirt(settings: Settings, services: BackendServices) -> Backend:
    """Remote (`qemu+ssh://`, `qemu+libssh://`) endpoints take their SSH key, known_hosts and
    password from the credentials; each reopen after a lost connection is counted."""
    from pyrigaud.adapters.hypervisors.libvirt.backend import (  # noqa: PLC0415
        build_libvirt_backend,
    )
    from pyrigaud.adapters.hypervisors.libvirt.connection import (  # noqa: PLC0415
        LibvirtConnection,
    )
    from pyrigaud.adapters.hypervisors.libvirt.storage import PoolSettings  # noqa: PLC0415

    connection = LibvirtConnection(
        settings.endpoint,
        credentials=services.credentials(),
        verify_host_key=not settings.libvirt_insecure_skip_host_key_verification,
        max_concurrent_calls=settings.libvirt_max_concurrent_calls,
        on_reconnect=services.metrics.session_reconnects.labels("libvirt").inc,
    )
    return build_libvirt_backend(
        connection,
        services.clock,
        domain_type=settings.libvirt_domain_type,  # `auto`: resolved per connection
        pools=PoolSettings(default_pool=settings.default_datastore or "default"),
        allow_loopback_urls=settings.image_url_allow_loopback,
        image_judge=services.image_judge,
        staging_types=services.staging.types,
        transfer_owner=settings.owner_mark,
        scratch_dir=_scratch_dir(settings),
    )


def _scratch_dir(settings: Settings) -> str | None:
    """PYRIGAUD_TRANSFER_SCRATCH_DIR, where disk conversions keep anonymous scratch files."""
    return str(settings.transfer_scratch_dir) if settings.transfer_scratch_dir else None


def _vsphere(settings: Settings, services: BackendServices) -> Backend:
    from pyrigaud.adapters.hypervisors.vsphere.backend import (  # noqa: PLC0415
        build_vsphere_backend,
    )

    return build_vsphere_backend(
        settings.endpoint,
        services.credentials(),
        insecure=settings.tls_insecure_skip_verify,
        defaults=Placement(
            datastore=settings.default_datastore,
            storage_pod=settings.default_storage_pod,
            cluster=settings.default_cluster,
            folder=settings.default_folder,
        ),
        on_relogin=services.metrics.session_reconnects.labels("vsphere").inc,
        allow_loopback_urls=settings.image_url_allow_loopback,
        on_resync=services.metrics.inventory_resyncs.labels("vsphere").inc,
        on_call=services.metrics.hypervisor_round_trips.labels("vsphere").inc,
        staging_types=services.staging.types,
        owner=settings.owner_mark,
        image_judge=services.image_judge,
        scratch_dir=_scratch_dir(settings),
    )


BACKENDS: Mapping[str, BackendEntry] = {
    "fake": BackendEntry(_fake, extra=None),
    "libvirt": BackendEntry(_libvirt, extra="libvirt", default_endpoint="test:///default"),
    "vsphere": BackendEntry(_vsphere, extra="vsphere"),
}
ALIASES = {"mock": "fake"}


def build_backend(settings: Settings, services: BackendServices) -> Backend:
    """The selected backend's ports (settings have checked that PROVIDER_TYPE is registered)."""
    return BACKENDS[settings.provider_type].build(settings, services)
