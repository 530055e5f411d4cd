"""Create with cloud-init data: the seed volume, its cdrom, and its clean-up, on the test driver.

The test driver cannot upload volumes, so these tests give the backend a writer that puts the
bytes straight into the pool directory's file; one test shows what the real stream upload
answers on the test driver and that Create then leaves nothing behind.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import libvirt
import pytest

from pyrigaud.adapters.hypervisors.libvirt.connection import LibvirtConnection
from pyrigaud.adapters.hypervisors.libvirt.metadata import NAMESPACE_URI
from pyrigaud.adapters.hypervisors.libvirt.storage import upload_volume, volume_xml
from pyrigaud.application.backend import Backend
from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.models import (
    CloneRequest,
    CreateRequest,
    NetworkAttachment,
    OwnerMark,
    VMClass,
)

from support import ManualClock, error_of, ok
from support.libvirt import clone_vm, create_vm, isolated_host_uri, make_backend, write_pool_file
from support.seed import seed_files, seed_path

OWNER = OwnerMark(provider="tests/libvirt-seed")
NS = {"p": NAMESPACE_URI}
USER_DATA = b"#cloud-config\nruncmd: [echo hi]\n"

Host = tuple[Backend, LibvirtConnection]


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    backend, connection = make_backend(
        isolated_host_uri(tmp_path), ManualClock(), volume_writer=write_pool_file
    )
    yield backend, connection
    connection.close()


def request(name: str, **changes: object) -> CreateRequest:
    return CreateRequest(name=name, vm_class=VMClass(cpu=1, memory_mib=256)).model_copy(
        update=changes
    )


def domain_xml(connection: LibvirtConnection, vm_id: str) -> ET.Element:
    text = ok(
        connection.call(
            lambda conn: conn.lookupByUUIDString(vm_id).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
        )
    )
    return ET.fromstring(text)


def pool_volumes(connection: LibvirtConnection) -> set[str]:
    return set(
        ok(connection.call(lambda conn: conn.storagePoolLookupByName("default").listVolumes()))
    )


def cdrom(root: ET.Element) -> ET.Element:
    (element,) = root.findall("devices/disk[@device='cdrom']")
    return element


def test_user_data_becomes_a_read_only_cidata_cdrom_recorded_as_ours(host: Host) -> None:
    backend, connection = host
    vm_id = ok(create_vm(backend, request("seeded", user_data=USER_DATA), OWNER))
    root = domain_xml(connection, vm_id)
    seed = cdrom(root)
    path = seed.find("source").get("file")  # type: ignore[union-attr]
    assert path is not None
    assert seed.find("readonly") is not None
    assert seed.find("target").get("bus") == "sata"  # type: ignore[union-attr]
    recorded = [node.get("path") for node in root.findall("metadata/p:vm/p:volumes/p:volume", NS)]
    assert path in recorded
    files = seed_files(Path(path).read_bytes())
    assert files["user-data"] == USER_DATA
    # The generated meta-data names the VM by the UUID libvirt reports.
    assert json.loads(files["meta-data"]) == {"instance-id": vm_id, "local-hostname": "seeded"}
    assert "network-config" not in files


def test_delete_removes_the_seed_with_the_disks(host: Host) -> None:
    backend, connection = host
    vm_id = ok(create_vm(backend, request("seeded", user_data=USER_DATA), OWNER))
    assert any(name.endswith(".iso") for name in pool_volumes(connection))
    ok(backend.lifecycle.delete(vm_id))
    assert pool_volumes(connection) == set()


def test_static_addressing_seeds_network_config_matching_the_nic_macs(host: Host) -> None:
    backend, connection = host
    networks = (
        NetworkAttachment(
            network_name="lan", static_ip="192.0.2.10", prefix=24, gateway="192.0.2.1"
        ),
        NetworkAttachment(network_name="lan", mac_address="52:54:00:12:34:56"),
    )
    vm_id = ok(create_vm(backend, request("static", networks=networks), OWNER))
    root = domain_xml(connection, vm_id)
    macs = [mac.get("address") for mac in root.findall("devices/interface/mac")]
    files = seed_files(Path(seed_path(root)).read_bytes())
    config = json.loads(files["network-config"])
    assert [nic["match"]["macaddress"] for nic in config["ethernets"].values()] == macs
    assert macs[1] == "52:54:00:12:34:56"
    assert config["ethernets"]["nic0"]["addresses"] == ["192.0.2.10/24"]
    assert files["user-data"] == b"#cloud-config\n"


def test_without_cloud_init_data_there_is_no_seed(host: Host) -> None:
    backend, connection = host
    vm_id = ok(create_vm(backend, request("plain"), OWNER))
    assert domain_xml(connection, vm_id).findall("devices/disk[@device='cdrom']") == []
    assert not any(name.endswith(".iso") for name in pool_volumes(connection))


def test_a_failure_after_the_seed_removes_it_too(host: Host) -> None:
    backend, connection = host
    nic = NetworkAttachment(network_name="lan", mac_address="01:00:5e:00:00:01")  # multicast
    error = error_of(
        create_vm(backend, request("broken", user_data=USER_DATA, networks=(nic,)), OWNER)
    )
    assert error.kind is ErrorKind.INVALID_SPEC
    assert pool_volumes(connection) == set()


def test_a_clone_does_not_share_the_sources_seed(host: Host) -> None:
    backend, connection = host
    source = ok(create_vm(backend, request("seeded", user_data=USER_DATA), OWNER))
    target = ok(clone_vm(backend, CloneRequest(source_vm_id=source, target_name="copy"), OWNER))
    source_seed = cdrom(domain_xml(connection, source)).find("source").get("file")  # type: ignore[union-attr]
    clone_seed = cdrom(domain_xml(connection, target)).find("source").get("file")  # type: ignore[union-attr]
    assert clone_seed != source_seed  # the clone has its own: see test_clone_seed.py
    ok(backend.lifecycle.delete(source))
    assert all(name.startswith("copy-") for name in pool_volumes(connection))


def test_the_stream_upload_is_unsupported_by_the_test_driver_and_create_cleans_up(
    tmp_path: Path,
) -> None:
    backend, connection = make_backend(isolated_host_uri(tmp_path), ManualClock())
    try:
        error = error_of(
            create_vm(backend, request("seeded", meta_data=b"instance-id: a\n"), OWNER)
        )
        assert error.kind is ErrorKind.UNSUPPORTED
        assert "virStorageVolUpload" in error.message
        assert pool_volumes(connection) == set()
        assert ok(backend.lifecycle.find_by_name("seeded")) is None
        ok(create_vm(backend, request("unseeded"), OWNER))  # without cloud-init data Create works
    finally:
        connection.close()


def test_the_stream_writer_meets_libvirts_own_refusal(tmp_path: Path) -> None:
    """The test driver refuses the real stream upload with the code the backend maps."""
    _, connection = make_backend(isolated_host_uri(tmp_path), ManualClock())

    def upload(conn: Any) -> None:
        volume = conn.storagePoolLookupByName("default").createXML(volume_xml("x.iso", 2048), 0)
        upload_volume(conn, volume, (b"\0" * 2048,))

    try:
        with pytest.raises(libvirt.libvirtError) as raised:
            ok(connection.call(upload))
        assert raised.value.get_error_code() == libvirt.VIR_ERR_NO_SUPPORT
    finally:
        connection.close()
