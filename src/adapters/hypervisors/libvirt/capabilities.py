"""CapabilitySource on libvirt: what the backend can do on its host."""

from __future__ import annotations

from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.libvirt.connection import VirConnect
from pyrigaud.adapters.hypervisors.libvirt.disk_transfer import EXPORT_FORMATS, IMPORT_FORMATS
from pyrigaud.adapters.hypervisors.libvirt.host import LibvirtHost
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import Capabilities

TEST_DRIVER = "TEST"  # virConnectGetType of libvirt's test driver
LIBVIRT_CAPABILITIES = Capabilities(
    supports_reconfigure_online=True,
    supports_disk_expansion_online=True,
    supports_snapshots=True,
    supports_memory_snapshots=True,
    supports_linked_clones=True,
    supports_image_import=True,  # from a pool volume, a local file, or an http(s) URL
    supported_disk_types=("qcow2",),
    supported_network_types=("network", "bridge", "user"),
    supports_clone=True,
    supports_hardware_upgrade=False,  # a machine-type bump is not a meaningful upgrade
    # Streamed between libvirt and the staging storage (disk_transfer.py); a powered-off VM.
    # The staging types and the transfer mode are the application's to claim (TransferClaims).
    supports_disk_export=True,
    supports_disk_import=True,
    supported_export_formats=EXPORT_FORMATS,
    supported_import_formats=IMPORT_FORMATS,
)


class LibvirtCapabilities:
    """What the backend can do on its host. Disk export and import need volume streams, which
    libvirt's test driver lacks (it answers them UNIMPLEMENTED): there they are not claimed."""

    def __init__(self, host: LibvirtHost) -> None:
        self._host = host
        self._streams: bool | None = None  # whether the driver has volume streams: not asked yet
        self._capabilities = LIBVIRT_CAPABILITIES
        self._without_streams = LIBVIRT_CAPABILITIES.model_copy(
            update={
                "supports_disk_export": False,
                "supports_disk_import": False,
                "supported_export_formats": (),
                "supported_import_formats": (),
            }
        )

    def capabilities(self) -> Capabilities:
        """The connection's driver is asked once (a URI's driver never changes); until it
        answers, the host is claimed as a hypervisor (its transfers answer UNAVAILABLE then,
        as every other call does)."""
        if self._streams is None:
            match self._host.run("read the driver", _driver_of):
                case Failure(_):
                    return self._capabilities
                case Success(driver):
                    self._streams = driver != TEST_DRIVER
        return self._capabilities if self._streams else self._without_streams


def _driver_of(conn: VirConnect) -> Result[str, ProviderError]:
    return Success(str(conn.getType()))
