"""The operator's client CLI: `pyrigaud vm|snapshot|clone|image|disk|caps|task ...`.

Flags are the manager's terms (`--cpu`, `--memory 2Gi`, `--template`, `--network NAME`);
each command sends the JSON the manager itself would send (payloads.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyrigaud.client import output, payloads
from pyrigaud.client.connection import (
    DEADLINES,
)
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2_grpc as pb_grpc

Handler = Callable[[pb_grpc.ProviderStub, argparse.Namespace], Any]
POWER_OPS = {
    "on": pb.POWER_OP_ON,
    "off": pb.POWER_OP_OFF,
    "reboot": pb.POWER_OP_REBOOT,
    "shutdown": pb.POWER_OP_SHUTDOWN_GRACEFUL,
}
VM_COLUMNS = ("id", "name", "power_state", "cpu", "memory_mib", "ips")
TASK_POLL_SECONDS = 1.0
TOP_LEVEL = ("vm", "snapshot", "clone", "image", "disk", "caps", "task")


def _read(path: Path | None) -> bytes:
    return path.read_bytes() if path else b""


def _spec(args: argparse.Namespace, name: str = "") -> payloads.VMSpec:
    return payloads.VMSpec(
        name=name,
        cpu=args.cpu or 0,
        memory=args.memory or "",
        firmware=args.firmware or "",
        disk_size=args.disk_size or "",
        image_path=args.image_path or "",
        image_url=args.image_url or "",
        template=args.template or "",
        image_format=args.image_format or "",
        networks=args.network or (),
        disks=args.disk or (),
        datastore=args.datastore or "",
        cluster=args.cluster or "",
        folder=args.folder or "",
        host=args.host or "",
        tags=args.tag or (),
    )


def _credentials(pairs: list[str] | None) -> dict[str, str]:
    result = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep:
            raise payloads.PayloadError(f"--credential {key!r} is not KEY=VALUE")
        result[key] = value
    return result


# --- handlers: one request each ---------------------------------------------------------


def vm_list(stub: pb_grpc.ProviderStub, _args: argparse.Namespace) -> Any:
    listed = stub.ListVMs(pb.ListVMsRequest(), timeout=DEADLINES["ListVMs"])
    return [output.as_dict(vm) for vm in listed.vms]


def vm_describe(stub: pb_grpc.ProviderStub, args: argparse.Namespace) -> Any:
    return stub.Describe(pb.DescribeRequest(id=args.id), timeout=DEADLINES["Describe"])


def vm_create(stub: pb_grpc.ProviderStub, args: argparse.Namespace) -> Any:
    fields = payloads.create_fields(_spec(args, args.name))
    request = pb.CreateRequest(
        name=args.name,
        class_json=fields.class_json,
        image_json=fields.image_json,
        networks_json=fields.networks_json,
        disks_json=fields.disks_json,
        placement_json=fields.placement_json,
        user_data=_read(args.user_data),
        meta_data=_read(args.meta_data),
        tags=args.tag or [],
    )
    return stub.Create(request, timeout=DEADLINES["Create"])


def vm_power(stub: pb_grpc.ProviderStub, args: argparse.Namespace) -> Any:
    request = pb.PowerRequest(
        id=args.id, op=POWER_OPS[args.op], graceful_timeout_seconds=args.graceful_timeout
    )
    return stub.Power(request, timeout=DEADLINES["Power"])


def vm_reconfigure(stub: pb_grpc.ProviderStub, args: argparse.Namespace) -> Any:
    desired = payloads.desired_json(
        _spec(args, args.name or ""), _read(args.user_data), _read(args.meta_data)
    )
    request = pb.ReconfigureRequest(id=args.id, desired_json=desired)
    return stub.Reconfigure(request, timeout=DEADLINES["Reconfigure"])


def vm_delete(stub: pb_grpc.ProviderStub, args: argparse.Namespace) -> Any:
    return stub.Delete(pb.DeleteRequest(id=args.id), timeout=DEADLINES["Delete"])


def snapshot_create(stub: pb_grpc.ProviderStub, args: argparse.Namespace) -> Any:
    request = pb.SnapshotCreateRequest(
        vm_id=args.vm_id,
        name_hint=args.name or "",
        include_memory=args.include_memory,
        description=args.description or "",
    )
    return stub.SnapshotCreate(request, timeout=DEADLINES["SnapshotCreate"])


def snapshot_delete(stub: pb_grpc.ProviderStub, args: argparse.Namespace) -> Any:
    request = pb.SnapshotDeleteRequest(vm_id=args.vm_id, snapshot_id=args.snapshot_id)
    return stub.SnapshotDelete(request, timeout=DEADLINES["SnapshotDelete"])


def snapshot_revert(stub: pb_grpc.ProviderStub, args: argparse.Namespace) -> Any:
    request = pb.SnapshotRevertRequest(vm_id=args.vm_id, snapshot_id=args.snapshot_id)
    return stub.SnapshotRevert(request, timeout=DEADLINES["SnapshotRevert"])


def clone(stub: pb_grpc.ProviderStub, args: argparse.Namespace) -> Any:
    request = pb.CloneRequest(
        source_vm_id=args.source,
        target_name=args.target,
        linked=args.linked,
        class_json=payloads.clone_class_json(args.cpu or 0, args.memory or ""),
        customize_json=payloads.customize_json(
            args.hostname or "", args.domain or "", args.time_zone or "", _read(args.user_data)
        ),
    )
    return stub.Clone(request, timeout=DEADLINES["Clone"])


def image_prepare(stub: pb_grpc.ProviderStub, args: argparse.Namespace) -> Any:
    image_json = payloads.image_prepare_json(
        path=args.path or "",
        url=args.url or "",
        template=args.template or "",
        image_format=args.format or "",
        checksum=args.checksum or "",
        storage_pool=args.storage_pool or "",
    )
    request = pb.ImagePrepareRequest(
        image_json=image_json, target_name=args.target, storage_hint=args.storage_hint or ""
    )
    return stub.ImagePrepare(request, timeout=DEADLINES["ImagePrepare"])


def disk_export(stub: pb_grpc.ProviderStub, args: argparse.Namespace) -> Any:
    request = pb.ExportDiskRequest(
        vm_id=args.vm_id,
        disk_id=args.disk_id or "",
        snapshot_id=args.snapshot or "",
        destination_url=args.destination,
        format=args.format,
        compress=args.compress,
        credentials=_credentials(args.credential),
        backend_type=args.backend_type,
        transfer_mode="relay",  # what the manager sends once it has resolved "auto"
        storage_options_json=args.storage_options or "",
    )
    return stub.ExportDisk(request, timeout=DEADLINES["ExportDisk"])


def disk_import(stub: pb_grpc.ProviderStub, args: argparse.Namespace) -> Any:
    request = pb.ImportDiskRequest(
        source_url=args.source,
        storage_hint=args.storage_hint or "",
        format=args.format,
        target_name=args.target_name or "",
        verify_checksum=bool(args.expected_checksum),
        expected_checksum=args.expected_checksum or "",
        credentials=_credentials(args.credential),
        backend_type=args.backend_type,
        transfer_mode="relay",
        storage_options_json=args.storage_options or "",
    )
    return stub.ImportDisk(request, timeout=DEADLINES["ImportDisk"])


def disk_info(stub: pb_grpc.ProviderStub, args: argparse.Namespace) -> Any:
    request = pb.GetDiskInfoRequest(
        vm_id=args.vm_id, disk_id=args.disk_id or "", snapshot_id=args.snapshot or ""
    )
    return stub.GetDiskInfo(request, timeout=DEADLINES["GetDiskInfo"])


def caps(stub: pb_grpc.ProviderStub, _args: argparse.Namespace) -> Any:
    return stub.GetCapabilities(pb.GetCapabilitiesRequest(), timeout=DEADLINES["GetCapabilities"])


def task_wait(stub: pb_grpc.ProviderStub, args: argparse.Namespace) -> Any:
    return wait_for(stub, args.id, args.timeout)


def wait_for(stub: pb_grpc.ProviderStub, task_id: str, timeout: float) -> pb.TaskStatusResponse:
    """Poll TaskStatus with a progress line (on a terminal) until done or `timeout`."""
    started = time.monotonic()
    live = sys.stderr.isatty()
    while True:
        status: pb.TaskStatusResponse = stub.TaskStatus(
            pb.TaskStatusRequest(task=pb.TaskRef(id=task_id)), timeout=DEADLINES["TaskStatus"]
        )
        waited = time.monotonic() - started
        if status.done or waited >= timeout:
            if live:
                sys.stderr.write("\r\033[K")
            return status
        if live:
            sys.stderr.write(f"\r\033[Ktask {task_id}: running ({waited:.0f} s)")
            sys.stderr.flush()
        time.sleep(TASK_POLL_SECONDS)
