"""The manager's VMMigration defaults on libvirt: the source keeps running, a snapshot is taken,
the disk is exported at that snapshot. The real guest writes a marker, the snapshot is taken, it
writes another over it; the export holds the first, and the VM made from the imported disk
boots."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb

from support.guest import READY, console, guest_exec, wait_for_agent
from support.replica import Replica

pytestmark = pytest.mark.timeout(600)

# Grown past the image: the marker goes where the guest keeps nothing.
CLASS_JSON = json.dumps({"CPU": 1, "MemoryMiB": 256, "DiskDefaults": {"SizeGiB": 1}})
PVC = "live"
MARKER_SECTOR = 1_600_000  # about 780 MiB into the 1 GiB disk
BOOT_SECONDS = 120
TRANSFER_SECONDS = 1800


def _write_marker(dom: Any, text: str) -> None:
    """`text` at MARKER_SECTOR of the guest's disk, written through to it."""
    command = f"printf {text} | dd of=/dev/vda bs=512 seek={MARKER_SECTOR} conv=notrunc,fsync"
    written = guest_exec(dom, "/bin/sh", "-c", command)
    assert written.code == 0, written.out


def test_a_running_guest_exported_at_its_snapshot_holds_what_it_had_written_then(
    provider: Replica, conn: Any, prepared_image: str, migration_root: Path
) -> None:
    stub = provider.stub
    (migration_root / PVC).mkdir(exist_ok=True)
    image_json = json.dumps({"Path": prepared_image, "Format": "qcow2"})
    source = stub.Create(
        pb.CreateRequest(name="guest-live", class_json=CLASS_JSON, image_json=image_json),
        timeout=300,
    ).id
    target = ""
    try:
        stub.Power(pb.PowerRequest(id=source, op=pb.POWER_OP_ON), timeout=120)
        dom = conn.lookupByUUIDString(source)
        with console(conn, dom) as serial:
            serial.wait_for(READY, BOOT_SECONDS)
        wait_for_agent(dom, BOOT_SECONDS)
        _write_marker(dom, "FIRST-MARKER")
        snapshot = stub.SnapshotCreate(
            pb.SnapshotCreateRequest(vm_id=source, name_hint="mig", include_memory=False),
            timeout=300,
        )
        _write_marker(dom, "LATER-MARKER")

        exported = stub.ExportDisk(
            pb.ExportDiskRequest(
                vm_id=source,
                snapshot_id=snapshot.snapshot_id,
                destination_url=f"pvc://{PVC}/live.raw",
                format="raw",
                backend_type="pvc",
                transfer_mode="relay",
            ),
            timeout=TRANSFER_SECONDS,
        )

        assert dom.isActive(), "the guest was stopped by its export"
        with (migration_root / PVC / "live.raw").open("rb") as staged:
            staged.seek(MARKER_SECTOR * 512)
            assert staged.read(12) == b"FIRST-MARKER"
        imported = stub.ImportDisk(
            pb.ImportDiskRequest(
                source_url=f"pvc://{PVC}/live.raw",
                format="raw",
                target_name="guest-live-migrated",
                verify_checksum=True,
                expected_checksum=exported.checksum,
                backend_type="pvc",
                transfer_mode="relay",
            ),
            timeout=TRANSFER_SECONDS,
        )
        target_image = json.dumps({"Path": imported.path, "Format": "qcow2"})
        target = stub.Create(
            pb.CreateRequest(
                name="guest-live-target", class_json=CLASS_JSON, image_json=target_image
            ),
            timeout=300,
        ).id
        started = time.monotonic()
        stub.Power(pb.PowerRequest(id=target, op=pb.POWER_OP_ON), timeout=120)
        with console(conn, conn.lookupByUUIDString(target)) as serial:
            ready = serial.wait_for(READY, BOOT_SECONDS)
        print(f"the live export's guest ready {time.monotonic() - started:.1f} s after Power ON")
        assert float(ready["uptime"]) > 0
    finally:
        for vm_id in (target, source):
            if vm_id:
                stub.Delete(pb.DeleteRequest(id=vm_id), timeout=300)
