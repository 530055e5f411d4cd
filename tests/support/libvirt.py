"""libvirt test-driver backends for the contract and libvirt suites.

`test:///<node.xml>` gives every connection its own fresh, in-memory host: nothing touches
the disk or the network, so each test gets a clean hypervisor.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import libvirt
from returns.result import Result

from pyrigaud.adapters.hypervisors.libvirt.backend import build_libvirt_backend
from pyrigaud.adapters.hypervisors.libvirt.connection import LibvirtConnection, Opener
from pyrigaud.adapters.hypervisors.libvirt.device_models import FallbackCounts
from pyrigaud.adapters.hypervisors.libvirt.storage import PoolSettings, VolumeWriter, upload_volume
from pyrigaud.application.backend import Backend
from pyrigaud.application.ports import Clock
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import CloneRequest, CreateRequest, OwnerMark

from support import ManualClock, ok
from support.transfer import IMAGE_JUDGE, TRANSFER_OWNER

BASE_IMAGE_NAME = "base.qcow2"
GIB = 1024**3


def node_xml(pool_dir: Path, *, with_default_pool: bool = True) -> str:
    """A test-driver host: a `default` dir pool and a `lan` network.

    The network carries an <ip> element: libvirt 9.0's test driver crashes answering
    interfaceAddresses for a network without one.
    """
    node = ET.Element("node")
    if with_default_pool:
        pool = ET.SubElement(node, "pool", {"type": "dir"})
        ET.SubElement(pool, "name").text = "default"
        ET.SubElement(ET.SubElement(pool, "target"), "path").text = str(pool_dir)
    network = ET.SubElement(node, "network")
    ET.SubElement(network, "name").text = "lan"
    ET.SubElement(network, "bridge", {"name": "virbr-test"})
    ip = ET.SubElement(network, "ip", {"address": "192.0.2.1", "netmask": "255.255.255.0"})
    ET.SubElement(ET.SubElement(ip, "dhcp"), "range", {"start": "192.0.2.2", "end": "192.0.2.254"})
    return ET.tostring(node, encoding="unicode")


def isolated_host_uri(tmp_path: Path, *, with_default_pool: bool = True) -> str:
    pool_dir = tmp_path / "pool"
    pool_dir.mkdir(exist_ok=True)
    node = tmp_path / "node.xml"
    node.write_text(node_xml(pool_dir, with_default_pool=with_default_pool))
    return f"test://{node}"


def write_pool_file(conn: Any, volume: Any, chunks: Iterable[bytes]) -> None:
    """Stands in for the stream upload the test driver lacks (VIR_ERR_NO_SUPPORT).

    The test driver's dir pools are real directories of this machine, so the bytes land in the
    file the volume's path names, where a test can read them back.
    """
    with open(volume.path(), "wb") as target:
        for chunk in chunks:
            target.write(chunk)


def libvirt_test_backend(
    connection: LibvirtConnection,
    clock: Clock,
    *,
    domain_type: str = "test",
    pools: PoolSettings | None = None,
    volume_writer: VolumeWriter = upload_volume,
    allow_loopback_urls: bool = False,
    owner: str = TRANSFER_OWNER,
    scratch_dir: str | None = None,
    hardware_fallbacks: FallbackCounts | None = None,
    on_resync: Callable[[], None] = lambda: None,
) -> Backend:
    """The libvirt backend as the container builds it, with the defaults the suites share."""
    return build_libvirt_backend(
        connection,
        clock,
        domain_type=domain_type,
        pools=pools or PoolSettings(),
        allow_loopback_urls=allow_loopback_urls,
        image_judge=IMAGE_JUDGE,
        transfer_owner=owner,
        volume_writer=volume_writer,
        scratch_dir=scratch_dir,
        hardware_fallbacks=hardware_fallbacks,
        on_resync=on_resync,
    )


def make_backend(
    uri: str,
    clock: ManualClock,
    *,
    opener: Opener = libvirt.open,
    volume_writer: VolumeWriter = upload_volume,
    allow_loopback_urls: bool = False,
    hardware_fallbacks: FallbackCounts | None = None,
) -> tuple[Backend, LibvirtConnection]:
    connection = LibvirtConnection(uri, opener=opener)
    backend = libvirt_test_backend(
        connection,
        clock,
        volume_writer=volume_writer,
        allow_loopback_urls=allow_loopback_urls,
        hardware_fallbacks=hardware_fallbacks,
    )
    return backend, connection


def create_vm(
    backend: Backend, request: CreateRequest, owner: OwnerMark
) -> Result[str, ProviderError]:
    """The new VM's id: libvirt makes it within the call (no task)."""
    return backend.lifecycle.start_create(request, owner).map(lambda vm: vm.id)


def clone_vm(
    backend: Backend, request: CloneRequest, owner: OwnerMark
) -> Result[str, ProviderError]:
    """The clone's id: libvirt makes it within the call (no task)."""
    assert backend.cloning is not None
    return backend.cloning.start_clone(request, owner).map(lambda vm: vm.id)


def add_base_image(connection: LibvirtConnection, size_gib: int = 2) -> str:
    """A qcow2 volume in the default pool, as an operator would have put it there."""
    volume = ET.Element("volume")
    ET.SubElement(volume, "name").text = BASE_IMAGE_NAME
    ET.SubElement(volume, "capacity", {"unit": "bytes"}).text = str(size_gib * GIB)
    ET.SubElement(volume, "allocation").text = "0"
    ET.SubElement(ET.SubElement(volume, "target"), "format", {"type": "qcow2"})
    xml = ET.tostring(volume, encoding="unicode")
    return str(
        ok(
            connection.call(
                lambda conn: conn.storagePoolLookupByName("default").createXML(xml, 0).path()
            )
        )
    )
