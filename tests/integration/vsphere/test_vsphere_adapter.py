"""The vSphere adapter against govmomi's vCenter simulator on loopback."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import pytest
from pyVmomi import vim as untyped_vim

from pyrigaud.adapters.clocks import SystemClock
from pyrigaud.adapters.credentials.mounted_secret import MountedSecretCredentials
from pyrigaud.adapters.hypervisors.vsphere.backend import vsphere_backend
from pyrigaud.adapters.hypervisors.vsphere.health import VSphereHealth
from pyrigaud.adapters.hypervisors.vsphere.properties import extra_config, retrieve
from pyrigaud.adapters.hypervisors.vsphere.session import VSphereSession, credentials_from
from pyrigaud.adapters.hypervisors.vsphere.vcenter import INSTANCE_UUID
from pyrigaud.application.backend import Backend
from pyrigaud.application.ports.vm_lifecycle import CreatedVM
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.models import (
    CloneRequest,
    Customization,
    DiskQuery,
    DiskSpec,
    Firmware,
    NetworkAttachment,
    OwnerMark,
    PerformanceProfile,
    Placement,
    SnapshotRequest,
    VMChanges,
    VMClass,
    VMImage,
)
from pyrigaud.domain.power import PowerState

from contract.harness import made
from support import error_kind, error_of, ok, present
from support.transfer import IMAGE_JUDGE
from support.vsphere import (
    TEMPLATE_VM,
    Simulator,
    backend_over,
    create_use_case,
    eventually,
    running_simulator,
    template_request,
    vm_ref,
)

OWNER = OwnerMark(provider="tests/vsphere")
vim: Any = untyped_vim  # pyVmomi's data-object constructors are untyped


request = template_request


def test_validate_answers_and_an_unreachable_endpoint_is_not_ok(simulator: Simulator) -> None:
    assert simulator.backend().health.check().ok
    closed = VSphereSession(
        "https://127.0.0.1:1/sdk", lambda: ("u", "p"), insecure=True, clock=SystemClock()
    )
    report = backend_over(closed).health.check()
    assert not report.ok
    assert "unavailable" in report.message
    not_vsphere = VSphereSession(
        simulator.endpoint.replace("/sdk", "/elsewhere"),
        lambda: ("u", "p"),
        insecure=True,
        clock=SystemClock(),
    )
    report = backend_over(not_vsphere).health.check()
    assert not report.ok
    assert "not a VIM server" in report.message


def test_wrong_credentials_are_unavailable_not_internal(simulator: Simulator) -> None:
    session = VSphereSession(
        simulator.endpoint, lambda: ("nobody", "wrong"), insecure=True, clock=SystemClock()
    )
    assert error_kind(backend_over(session).inventory.list_vms()) is ErrorKind.UNAVAILABLE


def test_list_vms_reports_the_inventory_in_one_listing(backend: Backend) -> None:
    vms = ok(backend.inventory.list_vms())
    template = next(vm for vm in vms if vm.name == TEMPLATE_VM)
    assert INSTANCE_UUID.fullmatch(template.id)
    assert template.cpu >= 1
    assert template.memory_mib > 0
    assert template.disks
    assert template.disks[0].path.endswith(".vmdk")
    assert template.networks
    assert template.networks[0].mac


def test_create_clones_the_template_applies_the_class_and_marks_ownership(
    backend: Backend,
) -> None:
    vm_id = made(
        backend.tasks,
        backend.lifecycle.start_create(request("vs-create", disks=(DiskSpec(size_gib=3),)), OWNER),
    )
    info = ok(backend.inventory.vm_info(vm_id))
    assert info is not None
    assert (info.name, info.cpu, info.memory_mib, info.power_state) == (
        "vs-create",
        2,
        512,
        PowerState.OFF,
    )
    assert [disk.size_gib for disk in info.disks][1:] == [3]
    record = ok(backend.lifecycle.find_by_name("vs-create"))
    assert record is not None
    assert record.owner == OWNER
    someone_else = OwnerMark(provider="someone/else")
    # The backend reports a name in use, whoever made the VM; the ownership rule decides.
    for owner in (OWNER, someone_else):
        again = backend.lifecycle.start_create(request("vs-create"), owner)
        assert error_kind(again) is ErrorKind.ALREADY_EXISTS
    again = create_use_case(backend, OWNER)(request("vs-create"))
    assert ok(again) == CreatedVM(id=vm_id)
    clash = create_use_case(backend, someone_else)(request("vs-create"))
    assert error_kind(clash) is ErrorKind.ALREADY_EXISTS


def test_a_create_failing_after_the_clone_leaves_nothing_behind(
    backend: Backend,
) -> None:
    too_many = tuple(DiskSpec(size_gib=1) for _ in range(16))  # more than one SCSI bus holds
    result = backend.lifecycle.start_create(request("vs-half", disks=too_many), OWNER)
    assert error_kind(result) is ErrorKind.RESOURCE_EXHAUSTED
    assert ok(backend.lifecycle.find_by_name("vs-half")) is None


def test_a_vm_not_made_by_pyrigaud_is_a_name_clash(backend: Backend) -> None:
    result = backend.lifecycle.start_create(request(TEMPLATE_VM), OWNER)
    assert error_kind(result) is ErrorKind.ALREADY_EXISTS


@pytest.mark.parametrize(
    "image",
    [VMImage(), VMImage(template_name="no-such-template"), VMImage(path="/images/x.qcow2")],
)
def test_images_vsphere_cannot_use_are_invalid_specs(backend: Backend, image: VMImage) -> None:
    assert (
        error_kind(backend.lifecycle.start_create(request("vs-bad", image=image), OWNER))
        is ErrorKind.INVALID_SPEC
    )
    assert ok(backend.lifecycle.find_by_name("vs-bad")) is None


@pytest.mark.parametrize("vm_id", ["", "vm-999999", "\x00x", "../../etc"])
def test_ids_that_name_nothing_are_missing(backend: Backend, vm_id: str) -> None:
    assert ok(backend.inventory.describe(vm_id)) is None
    assert ok(backend.inventory.vm_info(vm_id)) is None
    assert error_kind(backend.lifecycle.delete(vm_id)) is ErrorKind.NOT_FOUND
    assert error_kind(backend.power.power_on(vm_id)) is ErrorKind.NOT_FOUND


def test_power_is_idempotent_and_reboot_falls_back_to_reset(backend: Backend) -> None:
    vm_id = made(backend.tasks, backend.lifecycle.start_create(request("vs-power"), OWNER))
    ok(backend.power.power_on(vm_id))
    ok(backend.power.power_on(vm_id))
    ok(backend.power.reboot(vm_id))  # the simulator has no RebootGuest: this is the reset path
    description = ok(backend.inventory.describe(vm_id))
    assert description is not None
    assert description.power_state is PowerState.ON
    assert description.raw["name"] == "vs-power"
    ok(backend.power.power_off(vm_id))
    ok(backend.power.power_off(vm_id))
    assert ok(backend.power.power_state(vm_id)) is PowerState.OFF


def test_a_graceful_shutdown_records_and_clears_its_deadline(backend: Backend) -> None:
    vm_id = made(backend.tasks, backend.lifecycle.start_create(request("vs-shutdown"), OWNER))
    ok(backend.power.power_on(vm_id))
    assert ok(backend.power.shutdown_deadline(vm_id)) is None
    ok(backend.power.request_shutdown(vm_id, 1_900_000_000))
    assert ok(backend.power.shutdown_deadline(vm_id)) == 1_900_000_000
    ok(backend.power.clear_shutdown_deadline(vm_id))
    assert ok(backend.power.shutdown_deadline(vm_id)) is None


def test_reconfigure_changes_cpu_memory_and_grows_disks(backend: Backend) -> None:
    vm_id = made(
        backend.tasks,
        backend.lifecycle.start_create(request("vs-reconf", disks=(DiskSpec(size_gib=2),)), OWNER),
    )
    changes = VMChanges(cpu=3, memory_mib=1024, root_disk_gib=30, disks=(DiskSpec(size_gib=5),))
    ok(backend.lifecycle.reconfigure(vm_id, changes))
    listed = next(vm for vm in ok(backend.inventory.list_vms()) if vm.id == vm_id)
    assert (listed.cpu, listed.memory_mib) == (3, 1024)
    assert [disk.size_gib for disk in listed.disks] == [30, 5]
    shrink = backend.lifecycle.reconfigure(vm_id, VMChanges(root_disk_gib=1))
    assert error_kind(shrink) is ErrorKind.FAILED_PRECONDITION


def test_a_running_vm_without_hot_add_refuses_cpu_and_memory_changes(
    backend: Backend,
) -> None:
    vm_id = made(backend.tasks, backend.lifecycle.start_create(request("vs-hot"), OWNER))
    ok(backend.power.power_on(vm_id))
    refused = backend.lifecycle.reconfigure(vm_id, VMChanges(cpu=4))
    assert error_kind(refused) is ErrorKind.FAILED_PRECONDITION
    assert "CPU hot-add disabled" in error_of(refused).message
    refused = backend.lifecycle.reconfigure(vm_id, VMChanges(memory_mib=2048))
    assert "memory hot-add disabled" in error_of(refused).message
    ok(
        backend.lifecycle.reconfigure(vm_id, VMChanges(cpu=2, memory_mib=512))
    )  # unchanged values: fine
    info = ok(backend.inventory.vm_info(vm_id))
    assert info is not None
    assert (info.cpu, info.memory_mib) == (2, 512)
    ok(backend.power.power_off(vm_id))
    ok(backend.lifecycle.reconfigure(vm_id, VMChanges(cpu=4)))
    ok(backend.lifecycle.upgrade_hardware(vm_id, 0))
    assert error_kind(backend.lifecycle.upgrade_hardware("vm-999999", 0)) is ErrorKind.NOT_FOUND


def test_snapshots_are_found_by_their_id_and_gone_after_delete(backend: Backend) -> None:
    vm_id = made(backend.tasks, backend.lifecycle.start_create(request("vs-snap"), OWNER))
    snapshot = ok(
        present(backend.snapshots).create_snapshot(SnapshotRequest(vm_id=vm_id, name="before"))
    )
    assert snapshot.id.startswith("snapshot-")
    ok(present(backend.snapshots).revert_snapshot(vm_id, snapshot.id))
    ok(present(backend.snapshots).delete_snapshot(vm_id, snapshot.id))
    assert (
        error_kind(present(backend.snapshots).revert_snapshot(vm_id, snapshot.id))
        is ErrorKind.NOT_FOUND
    )
    assert (
        error_kind(present(backend.snapshots).delete_snapshot(vm_id, "nope")) is ErrorKind.NOT_FOUND
    )


def test_full_clone_applies_cpu(backend: Backend) -> None:
    source = made(backend.tasks, backend.lifecycle.start_create(request("vs-src"), OWNER))
    target = made(
        backend.tasks,
        present(backend.cloning).start_clone(
            CloneRequest(source_vm_id=source, target_name="vs-copy", cpu=4), OWNER
        ),
    )
    info = ok(backend.inventory.vm_info(target))
    assert info is not None
    assert (info.name, info.cpu) == ("vs-copy", 4)
    assert (
        ok(present(backend.disk_transfer).disk_details(DiskQuery(vm_id=target))).backing_file == ""
    )
    missing = CloneRequest(source_vm_id="vm-999999", target_name="vs-none")
    assert error_kind(present(backend.cloning).start_clone(missing, OWNER)) is ErrorKind.NOT_FOUND


def test_a_linked_clone_has_child_disks_of_the_newest_snapshot(
    backend: Backend,
) -> None:
    assert backend.capabilities.capabilities().supports_linked_clones
    source = made(backend.tasks, backend.lifecycle.start_create(request("vs-linked-src"), OWNER))
    linked = CloneRequest(source_vm_id=source, target_name="vs-linked", linked=True, cpu=3)
    refused = present(backend.cloning).start_clone(linked, OWNER)
    assert error_kind(refused) is ErrorKind.FAILED_PRECONDITION
    assert "SnapshotCreate" in error_of(refused).message
    assert ok(backend.lifecycle.find_by_name("vs-linked")) is None
    ok(present(backend.snapshots).create_snapshot(SnapshotRequest(vm_id=source, name="older")))
    ok(present(backend.snapshots).create_snapshot(SnapshotRequest(vm_id=source, name="newest")))
    target = made(backend.tasks, present(backend.cloning).start_clone(linked, OWNER))
    source_disk = ok(present(backend.disk_transfer).disk_details(DiskQuery(vm_id=source)))
    clone_disk = ok(present(backend.disk_transfer).disk_details(DiskQuery(vm_id=target)))
    assert clone_disk.backing_file == source_disk.path
    assert clone_disk.path != source_disk.path
    info = ok(backend.inventory.vm_info(target))
    assert info is not None
    assert (info.name, info.cpu) == ("vs-linked", 3)


def test_clone_customization_sets_networks_user_data_and_host_name(
    backend: Backend, simulator: Simulator
) -> None:
    source = made(backend.tasks, backend.lifecycle.start_create(request("vs-custom-src"), OWNER))
    customization = Customization(
        hostname="web-1",
        domain="example.test",
        user_data=b"#cloud-config\n",
        networks=(
            NetworkAttachment(portgroup="VM Network"),
            NetworkAttachment(portgroup="DC0_DVPG0"),
        ),
    )
    clone = CloneRequest(source_vm_id=source, target_name="vs-custom", customization=customization)
    target = made(backend.tasks, present(backend.cloning).start_clone(clone, OWNER))
    extra = extra_config(read_vm(simulator, target, ("config.extraConfig",)))
    assert json.loads(base64.b64decode(extra["guestinfo.metadata"])) == {
        "local-hostname": "web-1.example.test"
    }
    assert base64.b64decode(extra["guestinfo.userdata"]) == b"#cloud-config\n"
    info = ok(backend.inventory.vm_info(target))
    assert info is not None
    assert len(info.networks) == 2


def test_delete_removes_the_vm(backend: Backend) -> None:
    vm_id = made(backend.tasks, backend.lifecycle.start_create(request("vs-delete"), OWNER))
    ok(backend.power.power_on(vm_id))
    ok(backend.lifecycle.delete(vm_id))
    assert ok(backend.inventory.describe(vm_id)) is None
    assert ok(backend.lifecycle.find_by_name("vs-delete")) is None


def test_an_expired_session_is_renewed_once_with_fresh_credentials(simulator: Simulator) -> None:
    logins: list[int] = []

    def credentials() -> tuple[str, str]:
        logins.append(1)
        return simulator.username, simulator.password

    relogins: list[int] = []
    session = VSphereSession(
        simulator.endpoint,
        credentials,
        insecure=True,
        on_relogin=lambda: relogins.append(1),
        clock=SystemClock(),
    )
    health = VSphereHealth(session)  # always a round trip (a cached inventory may make none)
    assert health.check().ok
    session.call(lambda instance: instance.content.sessionManager.Logout())
    assert health.check().ok  # NotAuthenticated, then a new login, then the answer
    assert len(logins) == 2
    assert len(relogins) == 1  # the first login is not a re-login
    session.close()


def test_a_session_the_server_expired_for_idleness_is_renewed() -> None:
    """A simulator with a 1 s idle timeout: after 3 s idle the session is gone for sure."""
    with running_simulator("-idle-timeout", "1s") as short_lived:
        logins: list[int] = []

        def credentials() -> tuple[str, str]:
            logins.append(1)
            return short_lived.username, short_lived.password

        health = VSphereHealth(
            VSphereSession(short_lived.endpoint, credentials, insecure=True, clock=SystemClock())
        )
        assert health.check().ok
        time.sleep(3)
        assert health.check().ok
        assert len(logins) == 2


def test_describe_reports_guest_addresses_set_through_the_simulator_hook(
    backend: Backend, simulator: Simulator
) -> None:
    vm_id = made(backend.tasks, backend.lifecycle.start_create(request("vs-ips"), OWNER))
    ok(backend.power.power_on(vm_id))
    session = VSphereSession(
        simulator.endpoint,
        lambda: (simulator.username, simulator.password),
        insecure=True,
        clock=SystemClock(),
    )
    vm = session.call(lambda instance: vm_ref(instance, vm_id))
    spec = vim.vm.ConfigSpec(
        extraConfig=[vim.option.OptionValue(key="SET.guest.ipAddress", value="192.0.2.10")]
    )
    session.call(lambda _: vm.ReconfigVM_Task(spec))
    description = eventually(
        lambda: ok(backend.inventory.describe(vm_id)),
        lambda found: found is not None and bool(found.ips),  # another client's change
    )
    assert description is not None
    assert description.ips == ("192.0.2.10",)
    session.close()


def test_credentials_come_from_the_mounted_secret_and_are_re_read_at_login(
    simulator: Simulator, tmp_path: Path
) -> None:
    (tmp_path / "username").write_text(f"{simulator.username}\n")
    (tmp_path / "password").write_text(simulator.password)
    secret = MountedSecretCredentials(directory=tmp_path)

    def build() -> Backend:
        clock = SystemClock()
        return vsphere_backend(
            VSphereSession(simulator.endpoint, credentials_from(secret), True, clock=clock),
            clock=clock,
            defaults=Placement(),
            owner=OWNER.provider,
            image_judge=IMAGE_JUDGE,
        )

    assert build().health.check().ok
    (tmp_path / "password").unlink()
    report = build().health.check()
    assert not report.ok
    assert "lack password" in report.message


def test_placement_by_name_and_unknown_names_are_invalid_specs(
    backend: Backend,
) -> None:
    placement = Placement(datastore="LocalDS_0", cluster="DC0_C0", host="DC0_C0_H1")
    vm_id = made(
        backend.tasks,
        backend.lifecycle.start_create(request("vs-placed", placement=placement), OWNER),
    )
    info = ok(backend.inventory.vm_info(vm_id))
    assert info is not None
    assert info.disks[0].path.startswith("[LocalDS_0] vs-placed/")
    for field, wrong in [
        (fields.PLACEMENT_DATASTORE, Placement(datastore="nope")),
        (fields.PLACEMENT_CLUSTER, Placement(cluster="nope")),
        (fields.PLACEMENT_FOLDER, Placement(folder="nope")),
        (fields.PLACEMENT_HOST, Placement(host="nope")),
        (fields.PLACEMENT_STORAGE_POD, Placement(storage_pod="nope")),
    ]:
        result = backend.lifecycle.start_create(request("vs-misplaced", placement=wrong), OWNER)
        assert error_kind(result) is ErrorKind.INVALID_SPEC
        assert error_of(result).message.startswith(f"{field}:")
    assert ok(backend.lifecycle.find_by_name("vs-misplaced")) is None


def test_provider_default_placement_applies_when_the_request_has_none(
    simulator: Simulator,
) -> None:
    session = VSphereSession(
        simulator.endpoint,
        lambda: (simulator.username, simulator.password),
        insecure=True,
        clock=SystemClock(),
    )
    backend = backend_over(session, defaults=Placement(datastore="no-such-default"))
    result = backend.lifecycle.start_create(request("vs-defaulted"), OWNER)
    assert error_of(result).message.startswith(f"{fields.PLACEMENT_DATASTORE}:")


def read_vm(simulator: Simulator, vm_id: str, properties: tuple[str, ...]) -> dict[str, Any]:
    """Properties read straight from the simulator, to check what the adapter wrote."""
    session = VSphereSession(
        simulator.endpoint,
        lambda: (simulator.username, simulator.password),
        insecure=True,
        clock=SystemClock(),
    )
    try:
        return session.call(
            lambda instance: retrieve(instance, [vm_ref(instance, vm_id)], properties)
        )[0]
    finally:
        session.close()


def test_the_class_and_cloud_init_data_are_applied_after_the_clone(
    backend: Backend, simulator: Simulator
) -> None:
    vm_class = VMClass(
        cpu=2,
        memory_mib=1024,
        firmware=Firmware.UEFI,
        # The simulator's UpgradeVM_Task ignores the version asked for, so only its
        # removal from extraConfig is checked here.
        extra_config={"vsphere.hardwareVersion": "13", "custom.key": "x"},
        performance=PerformanceProfile(
            cpu_hot_add=True, memory_hot_add=True, nested_virtualization=True
        ),
    )
    wanted = request("vs-class", vm_class=vm_class, user_data=b"#cloud-config\n", meta_data=b"{}")
    vm_id = made(backend.tasks, backend.lifecycle.start_create(wanted, OWNER))
    row = read_vm(
        simulator,
        vm_id,
        (
            "config.firmware",
            "config.nestedHVEnabled",
            "config.cpuHotAddEnabled",
            "config.memoryHotAddEnabled",
            "config.extraConfig",
        ),
    )
    assert row["config.firmware"] == "efi"
    assert row["config.nestedHVEnabled"]
    assert row["config.cpuHotAddEnabled"]
    assert row["config.memoryHotAddEnabled"]
    extra = extra_config(row)
    assert base64.b64decode(extra["guestinfo.userdata"]) == b"#cloud-config\n"
    assert extra["guestinfo.userdata.encoding"] == "base64"
    assert base64.b64decode(extra["guestinfo.metadata"]) == b"{}"
    assert extra["custom.key"] == "x"
    assert extra["pyrigaud.owner"] == OWNER.provider
    assert "vsphere.hardwareVersion" not in extra
    ok(backend.power.power_on(vm_id))
    ok(backend.lifecycle.reconfigure(vm_id, VMChanges(cpu=4, memory_mib=2048)))  # hot-add: online
    info = ok(backend.inventory.vm_info(vm_id))
    assert info is not None
    assert (info.cpu, info.memory_mib) == (4, 2048)


@pytest.mark.parametrize(
    ("vm_class", "field"),
    [
        (
            VMClass(cpu=1, memory_mib=256, extra_config={"vsphere.hardwareVersion": "new"}),
            fields.class_extra_config("vsphere.hardwareVersion"),
        ),
    ],
)
def test_a_class_vsphere_cannot_apply_is_an_invalid_spec(
    backend: Backend, vm_class: VMClass, field: str
) -> None:
    result = backend.lifecycle.start_create(request("vs-badclass", vm_class=vm_class), OWNER)
    assert error_kind(result) is ErrorKind.INVALID_SPEC
    assert error_of(result).message.startswith(f"{field}:")
    assert ok(backend.lifecycle.find_by_name("vs-badclass")) is None


def test_extra_disks_are_provisioned_as_asked(backend: Backend, simulator: Simulator) -> None:
    disks = (
        DiskSpec(size_gib=1),
        DiskSpec(size_gib=1, type="thick"),
        DiskSpec(size_gib=1, type="eagerZeroedThick"),
    )
    vm_id = made(
        backend.tasks, backend.lifecycle.start_create(request("vs-provisioned", disks=disks), OWNER)
    )
    devices = read_vm(simulator, vm_id, ("config.hardware.device",))["config.hardware.device"]
    backings = [d.backing for d in devices if isinstance(d, vim.vm.device.VirtualDisk)][1:]
    assert [(b.thinProvisioned, bool(b.eagerlyScrub)) for b in backings] == [
        (True, False),
        (False, False),
        (False, True),
    ]
    sparse = (DiskSpec(size_gib=1, type="sparse"),)
    wrong = backend.lifecycle.start_create(request("vs-badtype", disks=sparse), OWNER)
    assert error_of(wrong).message.startswith(f"{fields.disk_type(0)}:")
    assert ok(backend.lifecycle.find_by_name("vs-badtype")) is None


def test_every_network_attachment_replaces_the_template_nics(
    backend: Backend,
) -> None:
    networks = (
        NetworkAttachment(portgroup="VM Network", model="e1000", mac_address="00:50:56:aa:bb:01"),
        NetworkAttachment(portgroup="DC0_DVPG0"),
    )
    vm_id = made(
        backend.tasks, backend.lifecycle.start_create(request("vs-nics", networks=networks), OWNER)
    )
    info = ok(backend.inventory.vm_info(vm_id))
    assert info is not None
    assert len(info.networks) == 2
    assert info.networks[0].mac == "00:50:56:aa:bb:01"
    wrong = (NetworkAttachment(portgroup="no-such-net"),)
    result = backend.lifecycle.start_create(request("vs-nonet", networks=wrong), OWNER)
    assert error_of(result).message.startswith("networks[0].portgroup:")
    assert ok(backend.lifecycle.find_by_name("vs-nonet")) is None
