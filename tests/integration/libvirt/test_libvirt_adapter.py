"""What the contract suite cannot say about the libvirt backend, on libvirt's test driver."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import libvirt
import pytest
from returns.result import Success

from pyrigaud.adapters.hypervisors.libvirt.connection import LibvirtConnection
from pyrigaud.adapters.hypervisors.libvirt.errors import provider_error
from pyrigaud.adapters.hypervisors.libvirt.metadata import NAMESPACE_URI, SCHEMA_VERSION
from pyrigaud.application.backend import Backend
from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.models import (
    CloneRequest,
    CreateRequest,
    DiskDefaults,
    DiskSpec,
    Firmware,
    NetworkAttachment,
    OwnerMark,
    PerformanceProfile,
    Placement,
    SecurityProfile,
    SnapshotRequest,
    VMChanges,
    VMClass,
    VMImage,
)
from pyrigaud.domain.power import PowerState

from support import ManualClock, error_kind, error_of, ok
from support.at_once import all_at_once
from support.libvirt import (
    add_base_image,
    clone_vm,
    create_vm,
    isolated_host_uri,
    libvirt_test_backend,
    make_backend,
)

OWNER = OwnerMark(provider="tests/libvirt")
NS = {"p": NAMESPACE_URI}


@pytest.fixture
def host(tmp_path: Path) -> Iterator[tuple[Backend, LibvirtConnection]]:
    backend, connection = make_backend(isolated_host_uri(tmp_path), ManualClock())
    yield backend, connection
    connection.close()


def request(name: str, **changes: object) -> CreateRequest:
    base = CreateRequest(name=name, vm_class=VMClass(cpu=1, memory_mib=256))
    return base.model_copy(update=changes)


def inactive_xml(connection: LibvirtConnection, vm_id: str) -> ET.Element:
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


def domain_names(connection: LibvirtConnection) -> set[str]:
    return {dom.name() for dom in ok(connection.call(lambda conn: conn.listAllDomains(0)))}


def test_domain_xml_carries_nics_disks_and_versioned_metadata(host: Any) -> None:
    backend, connection = host
    networks = (
        NetworkAttachment(network_name="lan", mac_address="52:54:00:aa:bb:cc"),
        NetworkAttachment(bridge="br0", model="e1000"),
        NetworkAttachment(),
    )
    vm_id = ok(
        create_vm(
            backend,
            request("xml-vm", networks=networks, disks=(DiskSpec(size_gib=3),), tags=("a", "b")),
            OWNER,
        )
    )
    root = inactive_xml(connection, vm_id)
    nics = root.findall("devices/interface")
    assert [nic.get("type") for nic in nics] == ["network", "bridge", "user"]
    assert nics[0].find("source").get("network") == "lan"  # type: ignore[union-attr]
    assert nics[0].find("mac").get("address") == "52:54:00:aa:bb:cc"  # type: ignore[union-attr]
    assert nics[1].find("source").get("bridge") == "br0"  # type: ignore[union-attr]
    assert [nic.find("model").get("type") for nic in nics] == [  # type: ignore[union-attr]
        "virtio",
        "e1000",
        "virtio",
    ]
    disks = root.findall("devices/disk")
    assert [disk.find("driver").get("type") for disk in disks] == ["qcow2", "qcow2"]  # type: ignore[union-attr]
    assert [disk.find("target").get("dev") for disk in disks] == ["vda", "vdb"]  # type: ignore[union-attr]
    ours = root.find("metadata/p:vm", NS)
    assert ours is not None
    assert ours.get("version") == str(SCHEMA_VERSION)
    assert ours.find("p:owner", NS).get("provider") == OWNER.provider  # type: ignore[union-attr]
    assert [tag.text for tag in ours.findall("p:tags/p:tag", NS)] == ["a", "b"]
    volumes = [volume.get("path") for volume in ours.findall("p:volumes/p:volume", NS)]
    assert volumes == [disk.find("source").get("file") for disk in disks]  # type: ignore[union-attr]
    assert float(ours.findtext("p:created", "", NS)) == ManualClock().now()


def test_hot_add_classes_get_headroom_and_cpu_grows_live(host: Any) -> None:
    backend, connection = host
    vm_class = VMClass(
        cpu=2,
        memory_mib=512,
        performance=PerformanceProfile(cpu_hot_add=True, memory_hot_add=True),
    )
    vm_id = ok(create_vm(backend, request("hot-vm", vm_class=vm_class), OWNER))
    root = inactive_xml(connection, vm_id)
    vcpu = root.find("vcpu")
    assert vcpu is not None
    assert (vcpu.get("current"), vcpu.text) == ("2", "8")
    assert root.findtext("maxMemory") == str(4 * 512 * 1024)
    assert root.find("cpu/numa/cell").get("cpus") == "0-7"  # type: ignore[union-attr]

    ok(backend.power.power_on(vm_id))
    ok(backend.lifecycle.reconfigure(vm_id, VMChanges(cpu=4)))
    live = ok(connection.call(lambda conn: conn.lookupByUUIDString(vm_id).info()))
    assert live[3] == 4  # the running guest has 4 vCPUs now, no reboot
    info = ok(backend.inventory.vm_info(vm_id))
    assert info is not None
    assert info.cpu == 4


def test_a_change_that_cannot_apply_live_is_stored_for_the_next_boot(host: Any) -> None:
    backend, connection = host
    vm_id = ok(create_vm(backend, request("cold-vm"), OWNER))
    ok(backend.power.power_on(vm_id))
    ok(backend.lifecycle.reconfigure(vm_id, VMChanges(cpu=2, memory_mib=1024)))
    live = ok(connection.call(lambda conn: conn.lookupByUUIDString(vm_id).info()))
    assert (live[2], live[3]) == (256 * 1024, 1)  # the running guest is unchanged
    info = ok(backend.inventory.vm_info(vm_id))
    assert info is not None
    assert (info.cpu, info.memory_mib) == (2, 1024)  # what it boots with next
    ok(backend.power.power_off(vm_id))
    ok(backend.power.power_on(vm_id))
    live = ok(connection.call(lambda conn: conn.lookupByUUIDString(vm_id).info()))
    assert (live[2], live[3]) == (1024 * 1024, 2)


def test_uefi_and_secure_boot_reach_the_domain_os(host: Any) -> None:
    backend, connection = host
    vm_class = VMClass(
        cpu=1,
        memory_mib=256,
        firmware=Firmware.UEFI,
        security=SecurityProfile(secure_boot=True),
    )
    vm_id = ok(create_vm(backend, request("uefi-vm", vm_class=vm_class), OWNER))
    root = inactive_xml(connection, vm_id)
    assert root.find("os").get("firmware") == "efi"  # type: ignore[union-attr]
    features = {f.get("name"): f.get("enabled") for f in root.iterfind("os/firmware/feature")}
    assert features == {"secure-boot": "yes", "enrolled-keys": "yes"}
    assert root.find("features/smm").get("state") == "on"  # type: ignore[union-attr]
    assert ok(backend.inventory.vm_info(vm_id)).provider_raw["firmware"] == "UEFI"
    ok(
        backend.lifecycle.delete(vm_id)
    )  # the test driver refuses the NVRAM flag: delete still works
    assert ok(backend.inventory.describe(vm_id)) is None


@pytest.mark.parametrize(
    ("action", "kind"),
    [
        (lambda conn: conn.lookupByName("nope"), ErrorKind.NOT_FOUND),
        (lambda conn: conn.storagePoolLookupByName("nope"), ErrorKind.NOT_FOUND),
        (lambda conn: conn.networkLookupByName("nope"), ErrorKind.NOT_FOUND),
        (lambda conn: conn.defineXML("<domain"), ErrorKind.INVALID_SPEC),
        (lambda conn: conn.lookupByUUIDString("not-a-uuid"), ErrorKind.INVALID_SPEC),
        (lambda conn: conn.getDomainCapabilities(None, None, None, None, 0), ErrorKind.UNSUPPORTED),
    ],
)
def test_libvirt_errors_map_by_code(host: Any, action: Any, kind: ErrorKind) -> None:
    _adapter, connection = host
    with pytest.raises(libvirt.libvirtError) as raised:
        ok(connection.call(action))
    error = provider_error(raised.value, "doing it")
    assert error.kind is kind
    assert error.message.startswith("doing it: ")


def test_stopping_a_stopped_domain_maps_to_failed_precondition(host: Any) -> None:
    backend, connection = host
    vm_id = ok(create_vm(backend, request("stopped-vm"), OWNER))
    with pytest.raises(libvirt.libvirtError) as raised:
        ok(connection.call(lambda conn: conn.lookupByUUIDString(vm_id).destroy()))
    assert provider_error(raised.value, "stop").kind is ErrorKind.FAILED_PRECONDITION
    ok(backend.power.power_off(vm_id))  # while the port method is idempotent


@pytest.mark.parametrize(
    "vm_id", ["", "not-a-uuid", "{6695eb01-f6a4-8304-79aa-97f2502e193f}", "\x00", "a" * 4096]
)
def test_ids_that_are_not_uuids_are_missing_never_invalid(host: Any, vm_id: str) -> None:
    backend, _connection = host
    assert ok(backend.inventory.describe(vm_id)) is None
    for result in (
        backend.power.power_off(vm_id),
        backend.lifecycle.reconfigure(vm_id, VMChanges(cpu=2)),
        backend.snapshots.create_snapshot(SnapshotRequest(vm_id=vm_id, name="s")),
        backend.power.shutdown_deadline(vm_id),
    ):
        assert error_kind(result) is ErrorKind.NOT_FOUND


def test_a_missing_named_pool_is_an_invalid_placement(host: Any) -> None:
    backend, connection = host
    before = pool_volumes(connection)
    result = create_vm(backend, request("nopool-vm", placement=Placement(datastore="fast")), OWNER)
    error = error_of(result)
    assert error.kind is ErrorKind.INVALID_SPEC
    assert error.message.startswith("placement.datastore")
    assert pool_volumes(connection) == before
    assert "nopool-vm" not in domain_names(connection)


def test_a_missing_named_network_is_an_invalid_spec_naming_the_nic(host: Any) -> None:
    backend, connection = host
    networks = (NetworkAttachment(network_name="lan"), NetworkAttachment(network_name="nope"))
    error = error_of(create_vm(backend, request("nonet-vm", networks=networks), OWNER))
    assert error.kind is ErrorKind.INVALID_SPEC
    assert error.message.startswith("networks[1].network_name")
    assert "nonet-vm" not in domain_names(connection)


def test_the_default_pool_is_created_when_missing(tmp_path: Path) -> None:
    backend, connection = make_backend(
        isolated_host_uri(tmp_path, with_default_pool=False), ManualClock()
    )
    vm_id = ok(create_vm(backend, request("pooled-vm"), OWNER))
    assert ok(connection.call(lambda conn: conn.storagePoolLookupByName("default").isActive())) == 1
    info = ok(backend.inventory.vm_info(vm_id))
    assert info is not None
    assert len(pool_volumes(connection)) == 1
    connection.close()


def test_creates_at_once_on_a_host_without_the_default_pool_all_make_their_vms(
    tmp_path: Path,
) -> None:
    """Each finds no pool and defines it; libvirt refuses all but the first ("already
    exists"), and the one defined is theirs too, as starting it twice is."""
    backend, connection = make_backend(
        isolated_host_uri(tmp_path, with_default_pool=False), ManualClock()
    )
    names = [f"racing-{index}" for index in range(8)]
    made = all_at_once([partial(create_vm, backend, request(name), OWNER) for name in names])
    assert [result.map(lambda _: "made") for result in made] == [Success("made")] * len(names)
    assert ok(connection.call(lambda conn: conn.storagePoolLookupByName("default").isActive())) == 1
    assert sorted(domain_names(connection)) == sorted(names)
    connection.close()


def test_a_failure_part_way_leaves_nothing_behind(host: Any) -> None:
    backend, connection = host
    before = pool_volumes(connection)
    # Both volumes are made, then libvirt refuses the definition (a multicast MAC).
    nic = NetworkAttachment(network_name="lan", mac_address="01:00:5e:00:00:01")
    result = create_vm(
        backend, request("partial-vm", networks=(nic,), disks=(DiskSpec(size_gib=1),)), OWNER
    )
    error = error_of(result)
    assert error.kind is ErrorKind.INVALID_SPEC
    assert "multicast" in error.message  # it failed at the definition, after the volumes
    assert pool_volumes(connection) == before
    assert "partial-vm" not in domain_names(connection)
    assert ok(backend.lifecycle.find_by_name("partial-vm")) is None


def test_delete_removes_the_vms_own_volumes_and_keeps_the_image(host: Any) -> None:
    backend, connection = host
    image = add_base_image(connection)
    vm_id = ok(
        create_vm(
            backend,
            request("img-vm", image=VMImage(path=image), disks=(DiskSpec(size_gib=1),)),
            OWNER,
        )
    )
    assert len(pool_volumes(connection)) == 3
    ok(backend.lifecycle.delete(vm_id))
    assert pool_volumes(connection) == {Path(image).name}


def test_an_image_root_disk_is_an_overlay_at_least_as_big_as_the_image(host: Any) -> None:
    backend, connection = host
    image = add_base_image(connection, size_gib=2)
    small = VMClass(cpu=1, memory_mib=256, disk_defaults=DiskDefaults(size_gib=1))
    vm_id = ok(
        create_vm(backend, request("overlay-vm", image=VMImage(path=image), vm_class=small), OWNER)
    )
    info = ok(backend.inventory.vm_info(vm_id))
    assert info is not None
    assert info.disks[0].size_gib == 2
    assert info.disks[0].format == "qcow2"
    path = info.disks[0].path
    volume = ET.fromstring(
        ok(connection.call(lambda conn: conn.storageVolLookupByPath(path).XMLDesc(0)))
    )
    assert volume.findtext("backingStore/path") == image


def test_a_name_taken_by_a_domain_without_our_mark_is_already_exists(host: Any) -> None:
    backend, connection = host
    ok(
        connection.call(
            lambda conn: conn.defineXML(
                "<domain type='test'><name>foreign</name><memory>262144</memory>"
                "<os><type>hvm</type></os></domain>"
            )
        )
    )
    assert error_kind(create_vm(backend, request("foreign"), OWNER)) is ErrorKind.ALREADY_EXISTS
    record = ok(backend.lifecycle.find_by_name("foreign"))
    assert record is not None
    assert record.owner is None


class CountingConnection:
    """The real test-driver connection, counting which of its methods are called."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        self.calls[name] += 1
        return getattr(self._conn, name)


def test_list_vms_is_one_bulk_listing(tmp_path: Path) -> None:
    opened: list[CountingConnection] = []

    def open_counting(uri: str) -> CountingConnection:
        opened.append(CountingConnection(libvirt.open(uri)))
        return opened[-1]

    backend, connection = make_backend(
        isolated_host_uri(tmp_path), ManualClock(), opener=open_counting
    )
    for index in range(5):
        ok(create_vm(backend, request(f"many-{index}"), OWNER))
    opened[0].calls.clear()
    listed = ok(backend.inventory.list_vms())
    assert len(listed) == 5
    calls = opened[0].calls
    assert calls["listAllDomains"] == 1
    assert calls["lookupByUUIDString"] == calls["lookupByName"] == 0  # no per-VM lookups
    connection.close()


def test_paused_is_off_and_power_on_resumes(host: Any) -> None:
    backend, connection = host
    vm_id = ok(create_vm(backend, request("pause-vm"), OWNER))
    ok(backend.power.power_on(vm_id))
    ok(connection.call(lambda conn: conn.lookupByUUIDString(vm_id).suspend()))
    assert ok(backend.power.power_state(vm_id)) is PowerState.OFF
    assert ok(backend.inventory.describe(vm_id)).raw["state"] == "paused"
    ok(backend.power.power_on(vm_id))
    state = ok(connection.call(lambda conn: conn.lookupByUUIDString(vm_id).state()))
    assert state[0] == libvirt.VIR_DOMAIN_RUNNING


def test_the_shutdown_deadline_lives_on_the_domain(host: Any) -> None:
    backend, connection = host
    vm_id = ok(create_vm(backend, request("deadline-vm"), OWNER))
    ok(backend.power.power_on(vm_id))
    ok(backend.power.request_shutdown(vm_id, 1_800_000_060))
    # Another backend on the same hypervisor (another replica) sees it: nothing is in memory.
    other = libvirt_test_backend(connection, ManualClock(), domain_type="test")
    assert ok(other.power.shutdown_deadline(vm_id)) == 1_800_000_060
    ours = inactive_xml(connection, vm_id).find("metadata/p:vm", NS)
    assert ours is not None
    assert ours.findtext("p:shutdown-deadline", "", NS) == "1800000060"
    assert ok(backend.power.power_state(vm_id)) is PowerState.OFF  # the test guest obeys at once


def test_snapshots_capture_memory_only_of_a_running_vm(host: Any) -> None:
    backend, _connection = host
    vm_id = ok(create_vm(backend, request("snap-vm"), OWNER))
    cold = ok(
        backend.snapshots.create_snapshot(
            SnapshotRequest(vm_id=vm_id, name="cold", include_memory=True)
        )
    )
    assert not cold.include_memory
    ok(backend.power.power_on(vm_id))
    warm = ok(
        backend.snapshots.create_snapshot(
            SnapshotRequest(vm_id=vm_id, name="warm", include_memory=True)
        )
    )
    assert warm.include_memory
    again = ok(backend.snapshots.create_snapshot(SnapshotRequest(vm_id=vm_id, name="warm")))
    assert again == warm  # a retried request answers with the same snapshot
    ok(backend.power.power_off(vm_id))
    ok(backend.snapshots.revert_snapshot(vm_id, "warm"))
    assert ok(backend.power.power_state(vm_id)) is PowerState.ON  # memory state restored


def test_the_test_driver_cannot_grow_volumes_and_says_so(host: Any) -> None:
    backend, _connection = host
    vm_id = ok(create_vm(backend, request("grow-vm"), OWNER))
    error = error_of(backend.lifecycle.reconfigure(vm_id, VMChanges(root_disk_gib=40)))
    assert error.kind is ErrorKind.UNSUPPORTED
    assert "virStorageVolResize" in error.message
    assert ok(backend.inventory.vm_info(vm_id)).disks[0].size_gib == 20


def test_a_linked_clone_of_a_running_source_is_refused(host: Any) -> None:
    backend, connection = host
    source = ok(create_vm(backend, request("run-src"), OWNER))
    ok(backend.power.power_on(source))
    before = pool_volumes(connection)
    result = clone_vm(
        backend, CloneRequest(source_vm_id=source, target_name="lnk", linked=True), OWNER
    )
    assert error_kind(result) is ErrorKind.FAILED_PRECONDITION
    assert pool_volumes(connection) == before
    full = ok(clone_vm(backend, CloneRequest(source_vm_id=source, target_name="full"), OWNER))
    source_nics = inactive_xml(connection, source).findall("devices/interface/mac")
    clone_nics = inactive_xml(connection, full).findall("devices/interface/mac")
    assert [mac.get("address") for mac in source_nics] != [mac.get("address") for mac in clone_nics]


def test_a_dead_connection_is_reopened(host: Any) -> None:
    backend, connection = host
    ok(connection.call(lambda conn: conn.close()))  # the daemon went away under us
    assert backend.health.check().ok
    assert ok(backend.inventory.list_vms()) == []  # a fresh test-driver host answers


def test_an_unreachable_host_is_an_unhealthy_answer_not_a_crash(tmp_path: Path) -> None:
    backend, connection = make_backend(f"test://{tmp_path}/missing.xml", ManualClock())
    report = backend.health.check()
    assert not report.ok
    assert "missing.xml" in report.message
    assert error_kind(backend.inventory.list_vms()) is ErrorKind.UNAVAILABLE
    connection.close()


def test_auto_on_the_test_driver_gives_its_test_domains(tmp_path: Path) -> None:
    connection = LibvirtConnection(isolated_host_uri(tmp_path))
    backend = libvirt_test_backend(connection, ManualClock(), domain_type="auto")
    try:
        assert backend.health.check().message.endswith(", test (auto) domains")
    finally:
        connection.close()
