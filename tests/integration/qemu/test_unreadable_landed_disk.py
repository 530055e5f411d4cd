"""A disk in the pool that the host's qemu-img cannot read (landed before the judge knew to
refuse it, or bent since): what libvirt runs qemu-img for on it fails by qemu's reason, as a
state of the disk (FAILED_PRECONDITION), never INTERNAL, and leaves nothing in the pool."""

from __future__ import annotations

import os
import struct
import subprocess
from pathlib import Path
from typing import Any

from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.models import OwnerMark, VMImage

from contract.harness import STAGED_FOLDER, STAGING_PVC
from support import error_of, ok
from support.libvirt import create_vm
from support.qemu import TEST_POOL, TEST_POOL_PATH, QemuHost
from support.transfer import disk_moves, export_disk

OWNER = OwnerMark(provider="tests/qemu")
QCOW2_HEADER_LENGTH_OFFSET = 100  # version 3's header_length (qemu's docs/interop/qcow2.txt)
QEMU_SAYS = "qcow2 header exceeds cluster size"


def unreadable_qcow2(conn: Any, tmp_path: Path, landed: Path) -> str:
    """A qcow2 of 512 B clusters whose header claims 1 KiB, at `landed` in the test pool as an
    import would have left it: qemu-img refuses to open it."""
    made = tmp_path / "made.qcow2"
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-o", "cluster_size=512", made, "1M"],
        check=True,
    )
    data = bytearray(made.read_bytes())
    struct.pack_into(">I", data, QCOW2_HEADER_LENGTH_OFFSET, 1024)
    landed.write_bytes(bytes(data))
    os.chmod(landed, 0o644)
    conn.storagePoolLookupByName(TEST_POOL).refresh(0)
    opened = subprocess.run(
        ["qemu-img", "info", landed], capture_output=True, text=True, check=False
    )
    assert QEMU_SAYS in opened.stderr  # the host's qemu-img refuses it
    return str(landed)


def test_create_on_a_disk_qemu_img_cannot_read_names_qemu_s_reason_and_leaves_nothing(
    qemu: QemuHost, conn: Any, tmp_path: Path
) -> None:
    landed = unreadable_qcow2(conn, tmp_path, TEST_POOL_PATH / "landed-unreadable.qcow2")
    files_before = set(os.listdir(TEST_POOL_PATH))
    domains_before = {dom.name() for dom in conn.listAllDomains(0)}

    refused = error_of(
        create_vm(
            qemu.backend,
            qemu.request("qemu-unreadable", image=VMImage(path=landed, format="qcow2")),
            OWNER,
        )
    )

    assert refused.kind is ErrorKind.FAILED_PRECONDITION
    assert "the host's qemu-img cannot read the disk image: " in refused.message
    assert QEMU_SAYS in refused.message
    assert "Child process" not in refused.message
    assert set(os.listdir(TEST_POOL_PATH)) == files_before
    conn.storagePoolLookupByName(TEST_POOL).refresh(0)
    volumes = {
        volume.path() for volume in conn.storagePoolLookupByName(TEST_POOL).listAllVolumes(0)
    }
    assert volumes == {str(TEST_POOL_PATH / name) for name in files_before}
    assert {dom.name() for dom in conn.listAllDomains(0)} == domains_before


def test_an_export_whose_backing_qemu_img_cannot_read_names_qemu_s_reason_and_leaves_nothing(
    qemu: QemuHost, conn: Any, tmp_path: Path
) -> None:
    """The VM's root is an overlay on its image; the export flattens it with the host's
    qemu-img (libvirt's copy of the volume), which cannot open the image bent since."""
    vm_id = ok(create_vm(qemu.backend, qemu.request("qemu-bent", image=qemu.image), OWNER))
    unreadable_qcow2(conn, tmp_path, Path(qemu.image.path))
    files_before = set(os.listdir(TEST_POOL_PATH))
    url = f"pvc://{STAGING_PVC}/{STAGED_FOLDER}/bent.qcow2"

    refused = error_of(export_disk(disk_moves(qemu.backend, qemu.staging_root), vm_id, url))

    assert refused.kind is ErrorKind.FAILED_PRECONDITION
    assert "the host's qemu-img cannot read the disk image: " in refused.message
    assert QEMU_SAYS in refused.message
    assert set(os.listdir(TEST_POOL_PATH)) == files_before
    staged = qemu.staging_root / STAGING_PVC / STAGED_FOLDER
    assert not staged.exists() or os.listdir(staged) == []
