"""ExportDisk and ImportDisk through a PVC, on every backend that has the disk port: what the
manager's migration relies on (an import's checksum and path, retries, name clashes, a refused
checksum), asked of the port with the requests the wire parsers make of the manager's."""

from __future__ import annotations

from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.models import DiskDefaults, OwnerMark, VMClass, VMImage

from contract.harness import Harness
from contract.steps import create
from support import error_kind, error_of, ok
from support.disk_image import qemu_img
from support.transfer import export_disk, import_disk

SMALL_DISK = VMClass(cpu=1, memory_mib=256, disk_defaults=DiskDefaults(size_gib=1))
# Another disk: libvirt compares what a volume holds, so the same disk staged in another
# format (raw) is not other bytes to it, but a disk of another size is, everywhere.
LARGER_DISK = VMClass(cpu=1, memory_mib=256, disk_defaults=DiskDefaults(size_gib=2))


def _source_vm(
    harness: Harness, owner: OwnerMark, name: str, vm_class: VMClass = SMALL_DISK
) -> str:
    return create(harness, owner, name, vm_class=vm_class)


def test_a_disk_exported_to_a_pvc_comes_back_as_an_image_a_vm_is_made_from(
    disk_transfer_harness: Harness, owner: OwnerMark
) -> None:
    harness = disk_transfer_harness
    port = harness.moves()
    vm_id = _source_vm(harness, owner, "contract-export")
    url = harness.staged_url("export.qcow2")
    if not harness.moves_bytes:  # a hypervisor that cannot hold bytes says so, stages nothing
        assert error_kind(export_disk(port, vm_id, url)) is ErrorKind.UNSUPPORTED
        assert not harness.staged_file("export.qcow2").exists()
        return

    exported = ok(export_disk(port, vm_id, url))
    imported = ok(
        import_disk(port, url, target_name="contract-in", expected_checksum=exported.checksum)
    )

    assert len(exported.checksum) == 64
    assert imported.checksum == exported.checksum
    assert imported.disk_id
    assert imported.actual_size_bytes > 0
    made = create(
        harness, owner, "contract-from-import", image=VMImage(path=imported.path, format="qcow2")
    )
    assert ok(harness.backend.inventory.vm_info(made)) is not None
    retried = import_disk(port, url, target_name="contract-in", expected_checksum=exported.checksum)
    assert ok(retried) == imported  # its first answer was lost


def test_other_bytes_under_a_taken_name_and_a_wrong_checksum_are_refused(
    disk_transfer_harness: Harness, owner: OwnerMark
) -> None:
    harness = disk_transfer_harness
    port = harness.moves()
    if not harness.moves_bytes:
        staged = harness.staged_file("other.raw")  # what another provider exported
        staged.parent.mkdir(parents=True, exist_ok=True)
        staged.write_bytes(b"\x5a" * 65536)
        refused = import_disk(port, harness.staged_url("other.raw"), disk_format="raw")
        assert error_kind(refused) is ErrorKind.UNSUPPORTED
        return
    small = _source_vm(harness, owner, "contract-small")
    larger = _source_vm(harness, owner, "contract-larger", LARGER_DISK)
    qcow2, other = harness.staged_url("small.qcow2"), harness.staged_url("larger.qcow2")
    exported = ok(export_disk(port, small, qcow2))
    other_disk = ok(export_disk(port, larger, other))
    assert other_disk.checksum != exported.checksum
    ok(import_disk(port, qcow2, target_name="contract-taken", expected_checksum=exported.checksum))

    clash = import_disk(port, other, target_name="contract-taken")
    wrong = import_disk(
        port, other, target_name="contract-checked", expected_checksum=exported.checksum
    )

    assert error_kind(clash) is ErrorKind.ALREADY_EXISTS
    assert error_kind(wrong) is ErrorKind.FAILED_PRECONDITION
    assert "expected_checksum" in error_of(wrong).message
    # Nothing landed under the refused name: had the larger disk landed there, the small one
    # would now clash with it.
    landed = import_disk(
        port, qcow2, target_name="contract-checked", expected_checksum=exported.checksum
    )
    assert ok(landed).checksum == exported.checksum


def test_an_image_of_virtual_size_0_is_refused_by_name_and_lands_nothing(
    disk_transfer_harness: Harness,
) -> None:
    """An empty disk (qemu-img makes one) is bad input on every backend, never a disk one
    target holds and another cannot; the name stays free for the disk meant."""
    harness = disk_transfer_harness
    port = harness.moves()
    for name, size in (("empty.qcow2", "0"), ("small.qcow2", "1M")):
        staged = harness.staged_file(name)
        staged.parent.mkdir(parents=True, exist_ok=True)
        qemu_img("create", "-q", "-f", "qcow2", staged, size)

    refused = import_disk(port, harness.staged_url("empty.qcow2"), target_name="contract-empty")

    if not harness.moves_bytes:  # a hypervisor that cannot hold bytes says so first
        assert error_kind(refused) is ErrorKind.UNSUPPORTED
        return
    assert error_kind(refused) is ErrorKind.INVALID_SPEC
    assert "the image holds an empty disk (virtual size 0)" in error_of(refused).message
    landed = import_disk(port, harness.staged_url("small.qcow2"), target_name="contract-empty")
    assert ok(landed).disk_id
