"""Clauses that change nothing: what any endpoint must answer before a VM exists."""

from __future__ import annotations

import grpc

from pyrigaud.client.conformance.session import (
    REFUSED_UNCLAIMED,
    NotApplicableError,
    Session,
    expect,
    missing_id,
)
from pyrigaud.client.connection import MAX_MESSAGE_BYTES
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb

NOT_FOUND = frozenset({grpc.StatusCode.NOT_FOUND})
INVALID = frozenset({grpc.StatusCode.INVALID_ARGUMENT})
# Every shape of id the manager might hold for a VM that is gone (docs/contract.md).
MISSING_IDS = ("", "vm-999999999", "no-such-vm", "../../etc/passwd", "bad\x7fid \u00e9")
TRANSFER_MODES = frozenset({"relay", "direct"})


def validate(session: Session) -> None:
    answer = session.answer("Validate", pb.ValidateRequest())
    expect(answer.ok, f"Validate answered ok=false: {answer.message!r}")


def capabilities(session: Session) -> None:
    caps: pb.GetCapabilitiesResponse = session.answer(
        "GetCapabilities", pb.GetCapabilitiesRequest()
    )
    session.capabilities = caps
    expect(
        not caps.supports_memory_snapshots or caps.supports_snapshots,
        "claims memory snapshots but not snapshots",
    )
    expect(
        not caps.supports_disk_export or bool(caps.supported_export_formats),
        "claims disk export but lists no export format",
    )
    expect(
        not caps.supports_disk_import or bool(caps.supported_import_formats),
        "claims disk import but lists no import format",
    )
    unknown = set(caps.supported_transfer_modes) - TRANSFER_MODES
    expect(not unknown, f"unknown transfer modes {sorted(unknown)} (the manager sends relay)")


def list_vms(session: Session) -> None:
    listed: pb.ListVMsResponse = session.answer("ListVMs", pb.ListVMsRequest())
    size = listed.ByteSize()
    expect(size < MAX_MESSAGE_BYTES, f"ListVMs answer is {size} bytes, over the 4 MiB limit")
    ids = [vm.id for vm in listed.vms]
    expect(all(ids), "a listed VM has an empty id")
    expect(len(set(ids)) == len(ids), "ListVMs lists an id twice")
    odd = [
        f"{vm.id}={vm.power_state!r}" for vm in listed.vms if vm.power_state not in ("On", "Off")
    ]
    expect(not odd, f"power_state neither 'On' nor 'Off': {', '.join(odd[:5])}")


def describe_missing(session: Session) -> None:
    for vm_id in (missing_id(), *MISSING_IDS):
        described = session.answer("Describe", pb.DescribeRequest(id=vm_id))
        expect(not described.exists, f"Describe({vm_id!r}) answered exists=true")


def missing_vm_not_found(session: Session) -> None:
    vm_id = missing_id()
    snapshots = session.claims("supports_snapshots")
    export = session.claims("supports_disk_export")
    why = "a missing VM is NOT_FOUND"
    checks: list[tuple[str, object, frozenset[grpc.StatusCode]]] = [
        ("Power", pb.PowerRequest(id=vm_id, op=pb.POWER_OP_ON), NOT_FOUND),
        ("Reconfigure", pb.ReconfigureRequest(id=vm_id, desired_json="{}"), NOT_FOUND),
        (
            "Clone",
            pb.CloneRequest(source_vm_id=vm_id, target_name=session.name("never")),
            NOT_FOUND,
        ),
        ("GetDiskInfo", pb.GetDiskInfoRequest(vm_id=vm_id), NOT_FOUND),
        (
            "HardwareUpgrade",  # no capability names it: UNIMPLEMENTED is honest too
            pb.HardwareUpgradeRequest(id=vm_id, target_version=19),
            NOT_FOUND | {grpc.StatusCode.UNIMPLEMENTED},
        ),
        (
            "SnapshotCreate",
            pb.SnapshotCreateRequest(vm_id=vm_id, name_hint="conformance"),
            NOT_FOUND if snapshots else NOT_FOUND | REFUSED_UNCLAIMED,
        ),
        (
            "SnapshotRevert",
            pb.SnapshotRevertRequest(vm_id=vm_id, snapshot_id="s"),
            NOT_FOUND if snapshots else NOT_FOUND | REFUSED_UNCLAIMED,
        ),
        (
            "SnapshotDelete",
            pb.SnapshotDeleteRequest(vm_id=vm_id, snapshot_id="s"),
            NOT_FOUND if snapshots else NOT_FOUND | REFUSED_UNCLAIMED,
        ),
        (
            "ExportDisk",
            pb.ExportDiskRequest(
                vm_id=vm_id,
                destination_url="pvc://conformance/missing.qcow2",
                format="qcow2",
                transfer_mode="relay",
            ),
            NOT_FOUND if export else NOT_FOUND | REFUSED_UNCLAIMED,
        ),
    ]
    for rpc, request, codes in checks:
        session.refused(rpc, request, codes, why)


def malformed_input(session: Session) -> None:
    not_json = session.create_request("malformed")
    not_json.class_json = "{not json"
    session.refused("Create", not_json, INVALID, "a class_json that is not JSON")
    negative = session.create_request("malformed")
    negative.class_json = negative.class_json.replace('"CPU": 1', '"CPU": -1')
    session.refused("Create", negative, INVALID, "a negative CPU count")
    nameless = session.create_request("malformed")
    nameless.name = ""
    session.refused("Create", nameless, INVALID, "an empty name")
    unspecified = pb.PowerRequest(id=missing_id(), op=pb.POWER_OP_UNSPECIFIED)
    session.refused(
        "Power", unspecified, INVALID | NOT_FOUND, "POWER_OP_UNSPECIFIED (or a missing VM)"
    )


def task_status_unknown(session: Session) -> None:
    for task_id in ("no-such-task", "vsphere-task:task-0:vm-0", "\x00?"):
        status = session.answer("TaskStatus", pb.TaskStatusRequest(task=pb.TaskRef(id=task_id)))
        expect(
            status.done and bool(status.error),
            f"TaskStatus({task_id!r}) answered done={status.done} error={status.error!r}; "
            "an unknown task is done with an error naming it",
        )


def unclaimed_import_refused(session: Session) -> None:
    """ImagePrepare and ImportDisk are refused when GetCapabilities does not claim them."""
    checked = []
    if not session.claims("supports_image_import"):
        request = pb.ImagePrepareRequest(
            image_json='{"source": {"libvirt": {"path": "/nonexistent/conformance.qcow2"}}}',
            target_name=session.name("image"),
        )
        session.refused(
            "ImagePrepare", request, REFUSED_UNCLAIMED, "supports_image_import is false"
        )
        checked.append("ImagePrepare")
    if not session.claims("supports_disk_import"):
        importing = pb.ImportDiskRequest(
            source_url="pvc://conformance/missing.qcow2",
            format="qcow2",
            target_name=session.name("import"),
            transfer_mode="relay",
        )
        session.refused("ImportDisk", importing, REFUSED_UNCLAIMED, "supports_disk_import is false")
        checked.append("ImportDisk")
    if not checked:
        raise NotApplicableError("image import and disk import are both claimed")
