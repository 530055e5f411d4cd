"""Clauses that make VMs (all named under the run's prefix, all removed at the end)."""

from __future__ import annotations

import ipaddress
import time

from pyrigaud.client.conformance.session import (
    BUG_CODES,
    REFUSED_UNCLAIMED,
    ContractBreachError,
    NotApplicableError,
    RpcRefusedError,
    Session,
    disk_size,
    expect,
    flat_strings,
    missing_id,
)
from pyrigaud.client.payloads import VMSpec, clone_class_json, desired_json, quantity_bytes
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb

from .read_only import INVALID, NOT_FOUND

GRACE_MARGIN_SECONDS = 30  # past the graceful timeout, the fallback power-off must be done
NEWEST_HARDWARE = 0  # HardwareUpgrade's target_version: the newest the host offers


def create(session: Session) -> None:
    vm_id = session.create("vm")
    session.vm_id = vm_id
    described = session.describe(vm_id)
    expect(described.exists, f"Describe({vm_id!r}) answered exists=false after Create")
    expect(described.power_state == "Off", f"Create left the VM {described.power_state}, not Off")


def create_idempotent(session: Session) -> None:
    vm_id = session.needs_vm()
    again = session.answer("Create", session.create_request("vm"))
    expect(again.id == vm_id, f"a second Create of the name answered {again.id!r}, not {vm_id!r}")
    session.wait("Create", again.task)


def list_vms_complete(session: Session) -> None:
    vm_id = session.needs_vm()
    vm = session.listed(vm_id)
    expect(vm is not None, f"ListVMs does not list the new VM {vm_id!r}")
    assert vm is not None
    expect(vm.name == session.name("vm"), f"ListVMs names it {vm.name!r}")
    expect(vm.power_state == "Off", f"ListVMs power_state {vm.power_state!r}, not Off")
    expect((vm.cpu, vm.memory_mib) == (1, 256), f"ListVMs cpu/memory {vm.cpu}/{vm.memory_mib}")
    for disk in vm.disks:
        expect(bool(disk.path or disk.id), "a listed disk has neither path nor id")


def disk_info(session: Session) -> None:
    """GetDiskInfo of the run's VM names its disk by path, with a size (at least the class's
    when it asks one); an unknown VM is NOT_FOUND."""
    vm_id = session.needs_vm()
    info = session.answer("GetDiskInfo", pb.GetDiskInfoRequest(vm_id=vm_id))
    expect(bool(info.path), f"GetDiskInfo({vm_id!r}) answered a disk with an empty path")
    asked = disk_size(session.options.image)
    least = quantity_bytes(asked) if asked else 1
    expect(
        info.virtual_size_bytes >= least,
        f"GetDiskInfo virtual_size_bytes {info.virtual_size_bytes}"
        + (f", under the {asked} the class asked" if asked else ""),
    )
    unknown = pb.GetDiskInfoRequest(vm_id=missing_id())
    session.refused("GetDiskInfo", unknown, NOT_FOUND, "a missing VM is NOT_FOUND")


def power_on(session: Session) -> None:
    vm_id = session.needs_vm()
    session.refused(
        "Power",
        pb.PowerRequest(id=vm_id, op=pb.POWER_OP_UNSPECIFIED),
        INVALID,
        "POWER_OP_UNSPECIFIED",
    )
    session.power(vm_id, pb.POWER_OP_ON)
    described = session.describe(vm_id)
    expect(described.power_state == "On", f"after Power ON, Describe says {described.power_state}")
    session.power(vm_id, pb.POWER_OP_ON)  # idempotent: ON on a running VM does nothing
    expect(session.describe(vm_id).power_state == "On", "a second Power ON turned the VM off")


def describe_running(session: Session) -> None:
    described = session.describe(session.needs_vm())
    expect(
        flat_strings(described.provider_raw_json),
        f"provider_raw_json is not a flat object of strings: {described.provider_raw_json[:200]!r}",
    )
    for address in described.ips:
        try:
            parsed = ipaddress.ip_address(address.split("%")[0])
        except ValueError:
            expect(False, f"ips holds {address!r}, not an address")
            continue
        expect(
            not (parsed.is_loopback or parsed.is_link_local),
            f"ips holds the loopback/link-local {address}",
        )


def reboot(session: Session) -> None:
    """REBOOT of the running VM answers OK or a task that ends done; the VM is On after it."""
    vm_id = session.needs_vm()
    before = session.describe(vm_id).power_state
    expect(before == "On", f"needs the VM On (power-on left it {before})")
    session.power(vm_id, pb.POWER_OP_REBOOT)
    after = session.describe(vm_id).power_state
    expect(after == "On", f"Power REBOOT answered done; Describe then says {after}, not On")


def graceful_shutdown(session: Session) -> None:
    vm_id = session.needs_vm()
    timeout = session.options.graceful_timeout_seconds
    request = pb.PowerRequest(
        id=vm_id, op=pb.POWER_OP_SHUTDOWN_GRACEFUL, graceful_timeout_seconds=timeout
    )
    started = time.monotonic()
    task = session.answer("Power", request).task
    repeated = session.answer("Power", request)  # the manager repeats it every 5 s
    session.wait("Power", task)
    session.wait("Power", repeated.task)
    took = time.monotonic() - started
    expect(
        took < timeout + GRACE_MARGIN_SECONDS,
        f"graceful shutdown took {took:.0f} s with a {timeout} s timeout (no fallback power-off?)",
    )
    described = session.describe(vm_id)
    expect(described.power_state == "Off", f"after the shutdown task, {described.power_state}")


def power_off_idempotent(session: Session) -> None:
    vm_id = session.needs_vm()
    session.power(vm_id, pb.POWER_OP_OFF)
    session.power(vm_id, pb.POWER_OP_SHUTDOWN_GRACEFUL, 60)
    expect(session.describe(vm_id).power_state == "Off", "OFF on a stopped VM changed its state")


def hardware_upgrade(session: Session) -> None:
    """No capability names HardwareUpgrade: a provider that upgrades finishes it on the stopped
    VM (still there, still Off); one that does not refuses UNIMPLEMENTED/FAILED_PRECONDITION."""
    vm_id = session.needs_vm()
    request = pb.HardwareUpgradeRequest(id=vm_id, target_version=NEWEST_HARDWARE)
    try:
        upgraded = session.call("HardwareUpgrade", request)
    except RpcRefusedError as refused:
        if refused.refusal.code in REFUSED_UNCLAIMED:
            raise NotApplicableError(
                f"the provider does not upgrade hardware ({refused.refusal})"
            ) from refused
        raise
    session.wait("HardwareUpgrade", upgraded.task)
    described = session.describe(vm_id)
    expect(described.exists, "the VM is gone after HardwareUpgrade")
    expect(
        described.power_state == "Off",
        f"HardwareUpgrade of a stopped VM left it {described.power_state}",
    )


def reconfigure(session: Session) -> None:
    vm_id = session.needs_vm()
    _reconfigure(session, vm_id, 2, "512Mi")
    expect(session.describe(vm_id).exists, "the VM is gone after Reconfigure")
    shown = _hardware(session, vm_id)
    expect(shown == (2, 512), f"Reconfigure to 2 CPU/512 MiB answered done; ListVMs shows {shown}")


def _reconfigure(session: Session, vm_id: str, cpu: int, memory: str) -> None:
    spec = VMSpec(name=session.name("vm"), cpu=cpu, memory=memory, extra=session.options.image)
    request = pb.ReconfigureRequest(id=vm_id, desired_json=desired_json(spec))
    session.wait("Reconfigure", session.answer("Reconfigure", request).task)


def _hardware(session: Session, vm_id: str) -> tuple[int, int]:
    vm = session.listed(vm_id)
    expect(vm is not None, f"ListVMs lost the VM {vm_id!r}")
    assert vm is not None
    return vm.cpu, vm.memory_mib


def snapshots(session: Session) -> None:
    """Create, revert (it restores the VM's hardware), delete; an unknown snapshot NOT_FOUND."""
    vm_id = session.needs_vm()
    create = pb.SnapshotCreateRequest(vm_id=vm_id, name_hint="conformance", description="kit")
    if not session.claims("supports_snapshots"):
        session.refused("SnapshotCreate", create, REFUSED_UNCLAIMED, "snapshots not claimed")
        return
    before = _hardware(session, vm_id)
    made = session.answer("SnapshotCreate", create, claimed="supports_snapshots")
    expect(bool(made.snapshot_id), "SnapshotCreate answered an empty snapshot_id")
    session.wait("SnapshotCreate", made.task)
    _reconfigure(session, vm_id, 1, "256Mi")
    revert = pb.SnapshotRevertRequest(vm_id=vm_id, snapshot_id=made.snapshot_id)
    session.wait("SnapshotRevert", session.answer("SnapshotRevert", revert).task)
    after = _hardware(session, vm_id)
    expect(after == before, f"SnapshotRevert answered done; cpu/memory {after}, not {before}")
    delete = pb.SnapshotDeleteRequest(vm_id=vm_id, snapshot_id=made.snapshot_id)
    session.wait("SnapshotDelete", session.answer("SnapshotDelete", delete).task)
    unknown = pb.SnapshotRevertRequest(vm_id=vm_id, snapshot_id=f"no-such-{missing_id()}")
    session.refused("SnapshotRevert", unknown, NOT_FOUND, "an unknown snapshot is NOT_FOUND")


def memory_snapshot(session: Session) -> None:
    """A claimed memory snapshot of a running VM is taken (and deleted)."""
    if not session.claims("supports_memory_snapshots"):
        raise NotApplicableError("supports_memory_snapshots is false")
    vm_id = session.needs_vm()
    session.power(vm_id, pb.POWER_OP_ON)
    create = pb.SnapshotCreateRequest(vm_id=vm_id, name_hint="memory", include_memory=True)
    made = session.answer("SnapshotCreate", create, claimed="supports_memory_snapshots")
    session.wait("SnapshotCreate", made.task)
    delete = pb.SnapshotDeleteRequest(vm_id=vm_id, snapshot_id=made.snapshot_id)
    session.wait("SnapshotDelete", session.answer("SnapshotDelete", delete).task)
    session.power(vm_id, pb.POWER_OP_OFF)


def uefi_snapshots(session: Session) -> None:
    """A running UEFI VM's disk-only snapshot (what the manager's migration takes) is taken,
    reverted and deleted. UEFI keeps its variables in flash beside the disks, which some
    hypervisors' snapshots leave out or refuse while the VM runs."""
    if not session.claims("supports_snapshots"):
        raise NotApplicableError("supports_snapshots is false")
    vm_id = session.create("uefi", firmware="UEFI")
    session.power(vm_id, pb.POWER_OP_ON)
    create = pb.SnapshotCreateRequest(vm_id=vm_id, name_hint="uefi")
    made = session.answer("SnapshotCreate", create, claimed="supports_snapshots")
    expect(bool(made.snapshot_id), "SnapshotCreate answered an empty snapshot_id")
    session.wait("SnapshotCreate", made.task)
    revert = pb.SnapshotRevertRequest(vm_id=vm_id, snapshot_id=made.snapshot_id)
    session.wait("SnapshotRevert", session.answer("SnapshotRevert", revert).task)
    delete = pb.SnapshotDeleteRequest(vm_id=vm_id, snapshot_id=made.snapshot_id)
    session.wait("SnapshotDelete", session.answer("SnapshotDelete", delete).task)
    session.wait("Delete", session.answer("Delete", pb.DeleteRequest(id=vm_id)).task)


def _clone(session: Session, suffix: str, *, linked: bool) -> None:
    vm_id = session.needs_vm()
    name = session.name(suffix)
    session.created[name] = ""
    request = pb.CloneRequest(
        source_vm_id=vm_id,
        target_name=name,
        linked=linked,
        class_json=clone_class_json(1, "256Mi"),  # the VMClass CRD spec, as the manager sends it
    )
    cloned = session.call("Clone", request)  # a refusal: clone() tells unsupported from broken
    expect(bool(cloned.target_vm_id), "Clone answered an empty target_vm_id")
    session.created[name] = cloned.target_vm_id
    session.wait("Clone", cloned.task)
    expect(session.describe(cloned.target_vm_id).exists, "Describe does not see the clone")
    shown = _hardware(session, cloned.target_vm_id)
    expect(shown == (1, 256), f"a clone with class 1 CPU/256Mi shows {shown} in ListVMs")
    session.wait("Delete", session.answer("Delete", pb.DeleteRequest(id=cloned.target_vm_id)).task)


def clone(session: Session) -> None:
    try:
        _clone(session, "clone", linked=False)
    except RpcRefusedError as refused:  # no capability claims full clones
        if refused.refusal.code in REFUSED_UNCLAIMED:
            raise NotApplicableError(
                f"the provider does not clone ({refused.refusal})"
            ) from refused
        raise


def linked_clone(session: Session) -> None:
    if not session.claims("supports_linked_clones"):
        raise NotApplicableError("supports_linked_clones is false (the manager never asks)")
    if session.claims("supports_snapshots"):  # vSphere links to the newest snapshot
        made = session.answer(
            "SnapshotCreate", pb.SnapshotCreateRequest(vm_id=session.needs_vm(), name_hint="base")
        )
        session.wait("SnapshotCreate", made.task)
    try:
        _clone(session, "linked", linked=True)
    except RpcRefusedError as refused:
        claim = "GetCapabilities claims supports_linked_clones"
        raise ContractBreachError(f"{refused.refusal} ({claim})") from refused


def unclaimed_export_refused(session: Session) -> None:
    if session.claims("supports_disk_export"):
        raise NotApplicableError("export is claimed (disk-export-import checks it)")
    request = pb.ExportDiskRequest(
        vm_id=session.needs_vm(),
        destination_url="pvc://conformance/export.qcow2",
        format="qcow2",
        transfer_mode="relay",
    )
    session.refused("ExportDisk", request, REFUSED_UNCLAIMED, "supports_disk_export is false")


def delete(session: Session) -> None:
    vm_id = session.needs_vm()
    session.wait("Delete", session.answer("Delete", pb.DeleteRequest(id=vm_id)).task)
    expect(not session.describe(vm_id).exists, "Describe still sees the VM after Delete")
    expect(session.listed(vm_id) is None, "ListVMs still lists the VM after Delete")
    session.wait("Delete", session.answer("Delete", pb.DeleteRequest(id=vm_id)).task)
    session.answer("Delete", pb.DeleteRequest(id=missing_id()))


def no_business_error_as_bug(session: Session) -> None:
    bugs = dict.fromkeys(str(refusal) for refusal in session.refusals if refusal.code in BUG_CODES)
    expect(not bugs, "UNKNOWN/INTERNAL (trip the manager's circuit breaker): " + "; ".join(bugs))
