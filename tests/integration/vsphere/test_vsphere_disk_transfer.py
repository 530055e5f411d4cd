"""vSphere ExportDisk and ImportDisk through the staging storage port, on the simulator: a disk
of known bytes imported from a PVC (as raw, qcow2 and streamOptimized vmdk), a VM made around
it, and its disk exported back in every format, compared byte for byte after conversion by the
real qemu-img; retries, clashes, checksum mismatches, a full scratch directory and a running
VM."""

from __future__ import annotations

import logging
import random
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyrigaud.application.backend import Backend
from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.models import (
    CreateRequest,
    OwnerMark,
    Placement,
    SnapshotRequest,
    VMClass,
    VMImage,
)

from contract.harness import made
from support import error_kind, error_of, ok
from support.image_corpus import HOSTILE, VALID, CorpusImage, hostile_image, oracle_raw, valid_image
from support.small_filesystem import small_filesystem
from support.transfer import DiskMoves, disk_moves, export_disk, import_disk
from support.vsphere import Simulator, backend_over, create_use_case, remove_vms_made_since

OWNER = OwnerMark(provider="tests/vsphere-transfer")
GRAIN = 64 * 1024
PVC = "mig"


def _disk_bytes(seed: int) -> bytes:
    """3 MiB + 1 KiB of random grains and zero grains (the zero ones stay sparse)."""
    rng = random.Random(seed)
    grains = [rng.randbytes(GRAIN) if i % 3 else bytes(GRAIN) for i in range(48)]
    return b"".join(grains) + rng.randbytes(1024)


RAW = _disk_bytes(14)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / PVC).mkdir()
    return tmp_path


@pytest.fixture
def ports(simulator: Simulator, root: Path) -> Iterator[Backend]:
    backend = backend_over(
        simulator.session(),
        defaults=Placement(datastore="LocalDS_0"),
    )
    before = {vm.id for vm in ok(backend.inventory.list_vms())}
    yield backend
    remove_vms_made_since(backend, before)


@pytest.fixture
def moves(ports: Backend, root: Path) -> DiskMoves:
    return disk_moves(ports, root, owner="tests/vsphere-transfer")


def _qemu_img(*arguments: str) -> None:
    subprocess.run(["qemu-img", *arguments], check=True, capture_output=True, timeout=120)


# What qemu-img is asked for each staged variant: (its format, its options).
MADE_AS = {
    "qcow2": ("qcow2", ["-c"]),
    "vmdk": ("vmdk", ["-o", "subformat=streamOptimized"]),
    "sparse-vmdk": ("vmdk", []),  # monolithicSparse, VMware Workstation's own
}


def _staged(root: Path, name: str, raw: bytes, variant: str) -> str:
    """RAW staged on the PVC as `variant` (made by qemu-img); the pvc:// URL."""
    raw_path = root / f"{name}.source.raw"
    raw_path.write_bytes(raw)
    target = root / PVC / name
    if variant == "raw":
        target.write_bytes(raw)
    else:
        disk_format, options = MADE_AS[variant]
        _qemu_img("convert", "-f", "raw", "-O", disk_format, *options, str(raw_path), str(target))
    return f"pvc://{PVC}/{name}"


def _raw_of(path: Path, size: int) -> bytes:
    raw = path.with_suffix(".back.raw")
    _qemu_img("convert", "-O", "raw", str(path), str(raw))
    return raw.read_bytes()[:size]


def _vm_around(ports: Backend, name: str, disk_path: str) -> str:
    request = CreateRequest(
        name=name,
        vm_class=VMClass(cpu=1, memory_mib=256),
        image=VMImage(path=disk_path, format="vmdk"),
    )
    return made(ports.tasks, create_use_case(ports, OWNER)(request))


@pytest.mark.parametrize("staged_format", ["raw", "qcow2", "vmdk", "sparse-vmdk"])
def test_a_disk_comes_in_and_goes_out_in_every_format_with_its_bytes(
    ports: Backend, moves: DiskMoves, root: Path, staged_format: str
) -> None:
    name = f"xfer-{staged_format}"
    url = _staged(root, f"{name}.{staged_format}", RAW, staged_format)
    imported = ok(import_disk(moves, url, target_name=name, disk_format="qcow2"))
    assert imported.path.startswith(f"[LocalDS_0] {name}/")
    assert imported.actual_size_bytes == (root / PVC / f"{name}.{staged_format}").stat().st_size
    vm_id = _vm_around(ports, name, imported.path)
    for out in ("vmdk", "qcow2", "raw"):
        exported = ok(export_disk(moves, vm_id, f"pvc://{PVC}/{name}.out.{out}", disk_format=out))
        staged = root / PVC / f"{name}.out.{out}"
        assert exported.estimated_size_bytes == staged.stat().st_size
        assert _raw_of(staged, len(RAW)) == RAW, out


def test_a_retried_import_answers_the_same_and_other_bytes_clash(
    moves: DiskMoves, root: Path
) -> None:
    url = _staged(root, "retry.raw", RAW, "raw")
    first = ok(import_disk(moves, url, target_name="xfer-retry", disk_format="raw"))
    again = ok(import_disk(moves, url, target_name="xfer-retry", disk_format="raw"))
    assert again == first
    verified = ok(
        import_disk(
            moves,
            url,
            target_name="xfer-retry",
            disk_format="raw",
            expected_checksum=first.checksum,
        )
    )
    assert verified == first
    other = _staged(root, "other.raw", _disk_bytes(15), "raw")
    clash = import_disk(moves, other, target_name="xfer-retry", disk_format="raw")
    assert error_kind(clash) is ErrorKind.ALREADY_EXISTS


def test_a_checksum_mismatch_lands_nothing(moves: DiskMoves, root: Path) -> None:
    url = _staged(root, "mismatch.raw", RAW, "raw")
    wrong = import_disk(moves, url, target_name="xfer-mismatch", expected_checksum="0" * 64)
    assert error_kind(wrong) is ErrorKind.FAILED_PRECONDITION
    retried = ok(import_disk(moves, url, target_name="xfer-mismatch"))
    assert retried.path.startswith("[LocalDS_0] xfer-mismatch/")  # nothing was in the way


def test_an_import_with_no_room_left_in_scratch_is_resource_exhausted_and_lands_nothing(
    simulator: Simulator, moves: DiskMoves, root: Path
) -> None:
    """A staged qcow2 is written to a scratch file for qemu-img to read: a scratch directory
    with no room left is the pod's resource exhausted, and nothing lands on the datastore."""
    url = _staged(root, "full.qcow2", RAW, "qcow2")
    with small_filesystem(1024**2) as small:
        cramped = backend_over(
            simulator.session(), defaults=Placement(datastore="LocalDS_0"), scratch_dir=str(small)
        )
        cramped_moves = disk_moves(cramped, root, owner="tests/vsphere-transfer")
        full = error_of(import_disk(cramped_moves, url, target_name="xfer-full"))

    assert full.kind is ErrorKind.RESOURCE_EXHAUSTED
    assert "No space left on device" in full.message
    retried = ok(import_disk(moves, url, target_name="xfer-full"))
    assert retried.path.startswith("[LocalDS_0] xfer-full/")  # nothing was in the way


@pytest.mark.parametrize(
    ("kept", "problem"),
    [
        ("half", "qemu-img refuses the image"),
        ("header", "vmdk"),  # not even the whole header
    ],
)
def test_a_staged_vmdk_qemu_cannot_read_whole_lands_nothing(
    moves: DiskMoves, root: Path, kept: str, problem: str
) -> None:
    """A staged streamOptimized vmdk goes to vCenter as it is: qemu reads it whole first."""
    url = _staged(root, "cut.vmdk", RAW, "vmdk")
    staged = root / PVC / "cut.vmdk"
    whole = staged.read_bytes()
    staged.write_bytes(whole[: len(whole) // 2] if kept == "half" else whole[:400])
    name = f"xfer-cut-{kept}"
    refused = import_disk(moves, url, target_name=name, disk_format="vmdk")
    assert error_kind(refused) is ErrorKind.INVALID_SPEC
    assert problem in error_of(refused).message
    retried = ok(import_disk(moves, _staged(root, "whole.raw", RAW, "raw"), target_name=name))
    assert retried.path.startswith(f"[LocalDS_0] {name}/")  # nothing was in the way


def test_a_running_vm_exports_only_from_a_snapshot(
    ports: Backend, moves: DiskMoves, root: Path
) -> None:
    url = _staged(root, "running.raw", RAW, "raw")
    imported = ok(import_disk(moves, url, target_name="xfer-running"))
    vm_id = _vm_around(ports, "xfer-running", imported.path)
    ok(ports.power.power_on(vm_id))
    refused = export_disk(moves, vm_id, f"pvc://{PVC}/running.out", disk_format="raw")
    assert error_kind(refused) is ErrorKind.FAILED_PRECONDITION
    assert ports.snapshots is not None
    snapshot = ok(ports.snapshots.create_snapshot(SnapshotRequest(vm_id=vm_id, name="mig")))
    ok(
        export_disk(
            moves,
            vm_id,
            f"pvc://{PVC}/running.out",
            disk_format="raw",
            snapshot_id=snapshot.id,
        )
    )
    assert _raw_of(root / PVC / "running.out", len(RAW)) == RAW


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("corpus")


def _staged_copy(root: Path, image: CorpusImage) -> str:
    shutil.copyfile(image.path, root / PVC / image.path.name)
    return f"pvc://{PVC}/{image.path.name}"


@pytest.mark.parametrize("name", sorted(VALID))
def test_every_image_kind_lands_as_the_disk_qemu_reads_from_it(
    ports: Backend, moves: DiskMoves, root: Path, corpus: Path, name: str
) -> None:
    """The corpus's valid images imported and exported again as raw: the disk is what
    `qemu-img convert -O raw` reads from the staged image (vSphere rounds a disk up to whole
    KiB, which read as zeros)."""
    image = valid_image(name, corpus)
    target = f"corpus-{name}"
    imported = ok(import_disk(moves, _staged_copy(root, image), target_name=target))
    vm_id = _vm_around(ports, target, imported.path)
    ok(export_disk(moves, vm_id, f"pvc://{PVC}/{target}.out.raw", disk_format="raw"))
    exported = (root / PVC / f"{target}.out.raw").read_bytes()
    oracle = oracle_raw(image, corpus)
    assert exported[: len(oracle)] == oracle
    assert not exported[len(oracle) :].strip(b"\0")


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_image_is_refused_and_lands_nothing(
    moves: DiskMoves, root: Path, corpus: Path, name: str
) -> None:
    target = f"hostile-{name}"
    refused = import_disk(
        moves, _staged_copy(root, hostile_image(name, corpus)), target_name=target
    )
    assert error_kind(refused) is ErrorKind.INVALID_SPEC, refused
    assert error_of(refused).message.startswith("source_url: ")
    retried = ok(import_disk(moves, _staged(root, "whole.raw", RAW, "raw"), target_name=target))
    assert retried.path.startswith(f"[LocalDS_0] {target}/")  # nothing was in the way


def test_an_export_at_a_snapshot_with_later_ones_says_they_stay_behind(
    ports: Backend, moves: DiskMoves, root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    imported = ok(
        import_disk(moves, _staged(root, "later.raw", RAW, "raw"), target_name="xfer-later")
    )
    vm_id = _vm_around(ports, "xfer-later", imported.path)
    assert ports.snapshots is not None
    first = ok(ports.snapshots.create_snapshot(SnapshotRequest(vm_id=vm_id, name="first")))
    second = ok(ports.snapshots.create_snapshot(SnapshotRequest(vm_id=vm_id, name="second")))
    with caplog.at_level(logging.WARNING):
        ok(
            export_disk(
                moves, vm_id, f"pvc://{PVC}/later.out", disk_format="raw", snapshot_id=first.id
            )
        )
    assert "later_snapshots" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        ok(
            export_disk(
                moves, vm_id, f"pvc://{PVC}/last.out", disk_format="raw", snapshot_id=second.id
            )
        )
    assert "later_snapshots" not in caplog.text
