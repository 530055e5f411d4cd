"""Health and capabilities of the vSphere backend."""

from __future__ import annotations

from pyrigaud.adapters.hypervisors.vsphere.devices import DISK_PROVISIONING
from pyrigaud.adapters.hypervisors.vsphere.errors import EXPECTED_FAILURES, provider_error
from pyrigaud.adapters.hypervisors.vsphere.session import VSphereSession
from pyrigaud.domain.models import Capabilities, HealthReport


class VSphereHealth:
    def __init__(self, session: VSphereSession) -> None:
        self._session = session

    def check(self) -> HealthReport:
        """vCenter's clock, read through the session: a login and one round trip."""
        try:
            self._session.call(lambda instance: instance.CurrentTime())
        except EXPECTED_FAILURES as error:
            return HealthReport(ok=False, message=str(provider_error(error, "vCenter")))
        return HealthReport(ok=True, message="vCenter reachable")


class VSphereCapabilities:
    """Fixed for the backend: images imported from OVA/OVF URLs; no disk export or import
    (ExportDisk and ImportDisk answer UNIMPLEMENTED)."""

    def capabilities(self) -> Capabilities:
        return Capabilities(
            supports_reconfigure_online=True,  # CPU/memory where hot-add is enabled
            supports_disk_expansion_online=True,
            supports_snapshots=True,
            supports_memory_snapshots=True,
            supports_linked_clones=True,
            supports_image_import=True,
            supports_clone=True,
            supports_hardware_upgrade=True,
            supported_disk_types=tuple(DISK_PROVISIONING),
            supported_network_types=("portgroup", "distributed-portgroup"),
        )
