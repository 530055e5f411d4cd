"""CapabilitySource on vSphere: what the backend can do on a vCenter."""

from __future__ import annotations

from pyrigaud.adapters.hypervisors.vsphere.devices import DISK_PROVISIONING
from pyrigaud.adapters.hypervisors.vsphere.disk_transfer import EXPORT_FORMATS, IMPORT_FORMATS
from pyrigaud.domain.models import Capabilities

VSPHERE_CAPABILITIES = Capabilities(
    supports_reconfigure_online=True,  # CPU/memory where hot-add is enabled
    supports_disk_expansion_online=True,
    supports_snapshots=True,
    supports_memory_snapshots=True,
    supports_linked_clones=True,
    supports_image_import=True,  # OVA/OVF URLs through an NFC import lease
    supports_clone=True,
    supports_hardware_upgrade=True,
    supported_disk_types=tuple(DISK_PROVISIONING),
    supported_network_types=("portgroup", "distributed-portgroup"),
    # Through NFC export and import leases, converted in the pod (disk_transfer.py). The
    # staging types and the transfer mode are the application's to claim (TransferClaims).
    supports_disk_export=True,
    supports_disk_import=True,
    supported_export_formats=EXPORT_FORMATS,
    supported_import_formats=IMPORT_FORMATS,
)


class VSphereCapabilities:
    def capabilities(self) -> Capabilities:
        return VSPHERE_CAPABILITIES
