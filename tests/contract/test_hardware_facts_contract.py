"""HardwareFacts on every backend that has it: the record an import kept is found again from
the Path ImportDisk answered, and a VM made from that disk with the guest's hardware reads it
back (what the export of a migrated VM writes into its hardware manifest). And the whole
travel on each backend: ExportDisk stages the manifest beside the disk, ImportDisk keeps what
it says in its record (unless it describes another disk), and Create from the imported disk
gives the guest that hardware, on a class saying BIOS, the CRD's default."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from pyrigaud.application.hardware_manifest import MANIFEST_SUFFIX
from pyrigaud.application.hardware_manifest import read as read_manifest
from pyrigaud.application.hardware_manifest import render as render_manifest
from pyrigaud.application.import_record import parse_record
from pyrigaud.application.ports.virtual_hardware import HardwareFacts
from pyrigaud.application.use_cases.create_vm import CreateVM
from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.hardware import DiskController, Firmware, NicModel, VirtualHardware
from pyrigaud.domain.models import OwnerMark, SecurityProfile, VMClass, VMImage

from contract.conftest import backend_params, harness_of
from contract.harness import Harness, made
from contract.steps import MISSING_IDS, create
from support import error_kind, ok
from support.transfer import export_disk, import_disk

# The backends that move disks (libvirt's test driver has no volume streams to import with).
WITH_HARDWARE_FACTS = backend_params(["fake", "vsphere-sim", "libvirt-qemu"])
UEFI_CLASS = VMClass(
    cpu=1, memory_mib=256, firmware=Firmware.UEFI, security=SecurityProfile(secure_boot=True)
)


@pytest.fixture(params=WITH_HARDWARE_FACTS)
def hardware_harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    yield from harness_of(request.param)


def _facts(harness: Harness) -> HardwareFacts:
    assert harness.backend.hardware is not None
    return harness.backend.hardware


def _imported_path(harness: Harness, owner: OwnerMark, name: str) -> str:
    """A disk exported from a new VM and imported again under `name`: its Path."""
    port = harness.moves()
    source = create(harness, owner, f"{name}-source")
    url = harness.staged_url(f"{name}.qcow2")
    exported = ok(export_disk(port, source, url))
    imported = ok(import_disk(port, url, target_name=name, expected_checksum=exported.checksum))
    return imported.path


def test_the_record_an_import_kept_is_found_from_its_path(
    hardware_harness: Harness, owner: OwnerMark
) -> None:
    harness = hardware_harness
    path = _imported_path(harness, owner, "contract-hw-record")
    record = ok(_facts(harness).import_record_of(path))
    assert record is not None
    assert json.loads(record)["path"] == path
    vm_id = create(harness, owner, "contract-hw-plain")
    plain = ok(harness.backend.inventory.vm_info(vm_id))
    assert plain is not None
    assert ok(_facts(harness).import_record_of(plain.disks[0].path)) is None  # never imported


def test_a_vm_made_with_the_guest_s_hardware_reads_it_back(
    hardware_harness: Harness, owner: OwnerMark
) -> None:
    harness = hardware_harness
    path = _imported_path(harness, owner, "contract-hw-guest")
    given = VirtualHardware(
        source_hypervisor="elsewhere",
        firmware=Firmware.UEFI,
        secure_boot=True,
        disk_controller=DiskController.PVSCSI,
        nic_models=(NicModel.VMXNET3,),
    )
    vm_id = create(
        harness,
        owner,
        "contract-hw-made",
        vm_class=UEFI_CLASS,
        image=VMImage(path=path, format="vmdk"),
        hardware=given,
    )
    read = ok(_facts(harness).hardware_of(vm_id, ""))
    assert read.source_hypervisor  # the backend names itself
    assert (read.firmware, read.secure_boot) == (Firmware.UEFI, True)
    assert read.disk_controller is DiskController.PVSCSI
    # A NIC the backend adds of its own (libvirt's user network) takes the guest's model too.
    assert set(read.nic_models) <= {NicModel.VMXNET3}
    described = ok(harness.backend.inventory.describe(vm_id))
    assert described is not None
    assert described.raw["disk_controller"] == "pvscsi"


@pytest.mark.parametrize("missing", MISSING_IDS)
def test_no_such_vm_or_disk_is_not_found(
    hardware_harness: Harness, owner: OwnerMark, missing: str
) -> None:
    facts = _facts(hardware_harness)
    assert error_kind(facts.hardware_of(missing, "")) is ErrorKind.NOT_FOUND
    vm_id = create(hardware_harness, owner, "contract-hw-disks")
    assert error_kind(facts.hardware_of(vm_id, "no-such-disk")) is ErrorKind.NOT_FOUND


def _uefi_pvscsi_source(harness: Harness, owner: OwnerMark, name: str) -> str:
    """A VM whose guest boots by UEFI from a ParaVirtual disk, with a vmxnet3 NIC."""
    path = _imported_path(harness, owner, f"{name}-disk")
    given = VirtualHardware(
        source_hypervisor="elsewhere",
        firmware=Firmware.UEFI,
        disk_controller=DiskController.PVSCSI,
        nic_models=(NicModel.VMXNET3,),
    )
    return create(
        harness,
        owner,
        name,
        vm_class=VMClass(cpu=1, memory_mib=256, firmware=Firmware.UEFI),
        image=VMImage(path=path, format="vmdk"),
        hardware=given,
    )


def test_the_guest_s_hardware_travels_with_its_disk(
    hardware_harness: Harness, owner: OwnerMark
) -> None:
    harness = hardware_harness
    source = _uefi_pvscsi_source(harness, owner, "contract-hw-travel")
    port = harness.moves()
    url = harness.staged_url("contract-hw-travel.qcow2")
    exported = ok(export_disk(port, source, url))
    manifest = harness.staged_file("contract-hw-travel.qcow2" + MANIFEST_SUFFIX).read_bytes()
    written, why = read_manifest(manifest, exported.checksum)
    assert written is not None, why
    assert (written.firmware, written.disk_controller) == (Firmware.UEFI, DiskController.PVSCSI)
    imported = ok(
        import_disk(port, url, target_name="contract-hw-moved", expected_checksum=exported.checksum)
    )
    record = parse_record(ok(_facts(harness).import_record_of(imported.path)) or b"")
    assert record is not None
    assert record.hardware == written

    create_vm = CreateVM(
        harness.backend.lifecycle, harness.ownership(owner), hardware=harness.backend.hardware
    )
    bios = harness.request(
        "contract-hw-moved",
        vm_class=VMClass(cpu=1, memory_mib=256),  # BIOS, as the CRD defaults it
        image=VMImage(path=imported.path, format="qcow2"),
    )
    moved_id = made(harness.backend.tasks, create_vm(bios))
    moved = ok(_facts(harness).hardware_of(moved_id, ""))
    assert (moved.firmware, moved.disk_controller) == (Firmware.UEFI, DiskController.PVSCSI)


def test_a_manifest_of_another_disk_is_not_kept(
    hardware_harness: Harness, owner: OwnerMark
) -> None:
    harness = hardware_harness
    source = _uefi_pvscsi_source(harness, owner, "contract-hw-stale")
    port = harness.moves()
    url = harness.staged_url("contract-hw-stale.qcow2")
    exported = ok(export_disk(port, source, url))
    beside = harness.staged_file("contract-hw-stale.qcow2" + MANIFEST_SUFFIX)
    stale = VirtualHardware(source_hypervisor="elsewhere", disk_controller=DiskController.IDE)
    beside.write_bytes(render_manifest(stale, "0" * 64))  # an earlier export's
    imported = ok(
        import_disk(port, url, target_name="contract-hw-fresh", expected_checksum=exported.checksum)
    )
    record = parse_record(ok(_facts(harness).import_record_of(imported.path)) or b"")
    assert record is not None
    assert record.result.checksum == exported.checksum
    assert record.hardware is None
