"""Clone with customization: the clone's own cloud-init seed, on the test driver.

The test driver cannot upload volumes, so these tests give the backend a writer that puts the
bytes straight into the pool directory's file (one test shows the real stream's refusal and
that the clone then leaves nothing behind). tests/integration/qemu/test_clone_customization.py
shows the same on real QEMU, through libvirt's own upload and download streams.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import libvirt
import pytest
from returns.result import Result

from pyrigaud.adapters.hypervisors.libvirt.connection import LibvirtConnection
from pyrigaud.adapters.hypervisors.libvirt.guest import Guest
from pyrigaud.adapters.hypervisors.libvirt.metadata import NAMESPACE_URI
from pyrigaud.application.backend import Backend
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ErrorKind, ProviderError
from pyrigaud.domain.models import (
    CloneRequest,
    CreateRequest,
    Customization,
    NetworkAttachment,
    OwnerMark,
    VMClass,
)

from support import ManualClock, error_of, ok
from support.libvirt import clone_vm, create_vm, isolated_host_uri, make_backend, write_pool_file
from support.seed import seed_files, seed_path

OWNER = OwnerMark(provider="tests/libvirt-clone-seed")
NS = {"p": NAMESPACE_URI}
SOURCE_USER_DATA = b"#cloud-config\nruncmd: [echo source]\n"
CLONE_USER_DATA = b"#!/bin/sh\necho clone\n"  # a script: carried byte for byte
CUSTOMIZATION = Customization(
    hostname="web",
    domain="example.com",
    time_zone="Europe/Berlin",
    user_data=CLONE_USER_DATA,
    networks=(
        NetworkAttachment(
            network_name="lan", static_ip="192.0.2.20", prefix=24, gateway="192.0.2.1"
        ),
    ),
)

Host = tuple[Backend, LibvirtConnection]


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    backend, connection = make_backend(
        isolated_host_uri(tmp_path), ManualClock(), volume_writer=write_pool_file
    )
    yield backend, connection
    connection.close()


def create(backend: Backend, name: str, **changes: object) -> str:
    request = CreateRequest(name=name, vm_class=VMClass(cpu=1, memory_mib=256))
    return made(create_vm(backend, request.model_copy(update=changes), OWNER))


def made(result: Result[Any, ProviderError]) -> str:
    """The new VM's id, whether the backend answers with the id or with its CreatedVM."""
    value = ok(result)
    return value if isinstance(value, str) else str(value.id)


def clone(name: str, source: str, **changes: object) -> CloneRequest:
    return CloneRequest(source_vm_id=source, target_name=name).model_copy(update=changes)


def domain_xml(connection: LibvirtConnection, vm_id: str) -> ET.Element:
    text = ok(
        connection.call(
            lambda conn: conn.lookupByUUIDString(vm_id).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
        )
    )
    return ET.fromstring(text)


def recorded_volumes(root: ET.Element) -> list[str]:
    return [node.get("path", "") for node in root.findall("metadata/p:vm/p:volumes/p:volume", NS)]


def pool_volumes(connection: LibvirtConnection) -> set[str]:
    return set(
        ok(connection.call(lambda conn: conn.storagePoolLookupByName("default").listVolumes()))
    )


@pytest.mark.parametrize("linked", [False, True])
def test_a_customized_clone_gets_its_own_seed_naming_it(host: Host, linked: bool) -> None:
    backend, connection = host
    source = create(backend, "source")
    target = made(
        clone_vm(backend, clone("copy", source, linked=linked, customization=CUSTOMIZATION), OWNER)
    )
    root = domain_xml(connection, target)
    path = seed_path(root)
    assert path in recorded_volumes(root)  # Delete removes it
    assert root.find("devices/disk[@device='cdrom']/readonly") is not None
    files = seed_files(Path(path).read_bytes())
    # instance-id is the clone's UUID (cloud-init runs again); the FQDN names the clone.
    assert json.loads(files["meta-data"]) == {
        "instance-id": target,
        "local-hostname": "web.example.com",
    }
    assert files["user-data"] == CLONE_USER_DATA
    (mac,) = [node.get("address") for node in root.findall("devices/interface/mac")]
    config = json.loads(files["network-config"])
    assert config["ethernets"]["nic0"] == {
        "match": {"macaddress": mac},
        "addresses": ["192.0.2.20/24"],
        "routes": [{"to": "default", "via": "192.0.2.1"}],
    }
    source_macs = [n.get("address") for n in domain_xml(connection, source).iter("mac")]
    assert mac not in source_macs
    # The time zone as vendor-data: under the user-data, which stays exactly as given.
    assert files["vendor-data"] == b'#cloud-config\n{"timezone": "Europe/Berlin"}\n'


def test_a_clone_of_a_seeded_source_gets_a_fresh_seed_and_the_sources_stays(host: Host) -> None:
    backend, connection = host
    source = create(backend, "source", user_data=SOURCE_USER_DATA)
    source_seed = seed_path(domain_xml(connection, source))
    source_bytes = Path(source_seed).read_bytes()
    target = made(clone_vm(backend, clone("copy", source), OWNER))
    root = domain_xml(connection, target)
    files = seed_files(Path(seed_path(root)).read_bytes())
    assert seed_path(root) != source_seed
    assert json.loads(files["meta-data"]) == {"instance-id": target, "local-hostname": "copy"}
    # The source's cloud-init already ran on the copied disk; its data is not replayed.
    assert files["user-data"] == b"#cloud-config\n"
    assert "network-config" not in files
    assert "vendor-data" not in files
    ok(backend.lifecycle.delete(target))
    assert not any(name.startswith("copy-") for name in pool_volumes(connection))
    assert Path(source_seed).read_bytes() == source_bytes
    assert seed_path(domain_xml(connection, source)) == source_seed


def test_a_clone_without_customization_of_an_unseeded_source_has_no_seed(host: Host) -> None:
    backend, connection = host
    source = create(backend, "source")
    target = made(clone_vm(backend, clone("copy", source, customization=Customization()), OWNER))
    assert domain_xml(connection, target).findall("devices/disk[@device='cdrom']") == []
    assert not any(name.endswith(".iso") for name in pool_volumes(connection))


def test_the_building_clone_records_the_seed_before_it_is_written(tmp_path: Path) -> None:
    """A provider killed while the seed is written leaves it recorded on the placeholder."""
    seen: list[tuple[str, tuple[str, ...], bool]] = []

    def recording_writer(conn: Any, volume: Any, chunks: Iterable[bytes]) -> None:
        metadata = Guest(conn.lookupByName("copy")).metadata()
        assert metadata is not None
        seen.append((str(volume.path()), metadata.volumes, metadata.building))
        write_pool_file(conn, volume, chunks)

    backend, connection = make_backend(
        isolated_host_uri(tmp_path), ManualClock(), volume_writer=recording_writer
    )
    try:
        source = create(backend, "source")
        made(clone_vm(backend, clone("copy", source, customization=CUSTOMIZATION), OWNER))
        ((written, planned, building),) = seen
        assert building
        assert written in planned
    finally:
        connection.close()


@pytest.mark.parametrize(
    ("customization", "field"),
    [
        (
            Customization(networks=(NetworkAttachment(), NetworkAttachment(static_ip="192.0.2.5"))),
            fields.customize_network(1),
        ),
    ],
)
def test_customization_the_clone_cannot_apply_is_refused_before_anything_is_made(
    host: Host, customization: Customization, field: str
) -> None:
    backend, connection = host
    source = create(backend, "source")
    before = pool_volumes(connection)
    error = error_of(clone_vm(backend, clone("copy", source, customization=customization), OWNER))
    assert error.kind is ErrorKind.INVALID_SPEC
    assert error.message.startswith(f"{field}:")
    assert pool_volumes(connection) == before
    assert ok(backend.lifecycle.find_by_name("copy")) is None


def test_the_test_drivers_missing_upload_refuses_customization_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    backend, connection = make_backend(isolated_host_uri(tmp_path), ManualClock())
    try:
        source = create(backend, "source")
        before = pool_volumes(connection)
        error = error_of(
            clone_vm(backend, clone("copy", source, customization=CUSTOMIZATION), OWNER)
        )
        assert error.kind is ErrorKind.UNSUPPORTED
        assert "virStorageVolUpload" in error.message
        assert pool_volumes(connection) == before
        assert ok(backend.lifecycle.find_by_name("copy")) is None
        made(clone_vm(backend, clone("plain", source), OWNER))  # without customization Clone works
    finally:
        connection.close()
