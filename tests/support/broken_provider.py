"""A deliberately broken provider.v1 endpoint, for the conformance kit to catch: it answers
UNKNOWN for a VM it does not have (Describe) and claims snapshots it then refuses. Everything
else it does as the contract says, so the kit's report must name exactly those faults; on
request it breaks more (a reboot that stops the VM and a disk without a path, an import with
another checksum, a TaskStatus past the deadline)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc

from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2_grpc as pb_grpc


@dataclass
class Vm:
    name: str
    cpu: int
    memory_mib: int
    on: bool = False


DISK_BYTES = 2**30


class BrokenProvider(pb_grpc.ProviderServicer):
    def __init__(
        self,
        task_status_delay: float = 0.0,
        claims_transfers: bool = False,
        reboot_and_disk_faults: bool = False,
    ) -> None:
        self.vms: dict[str, Vm] = {}
        self._lock = threading.Lock()
        self._task_status_delay = task_status_delay  # past 10 s: blocks like upstream vSphere
        self._claims_transfers = claims_transfers  # then imports answer another checksum
        self._reboot_and_disk_faults = reboot_and_disk_faults

    def _vm(self, vm_id: str, context: grpc.ServicerContext) -> Vm:
        if vm_id not in self.vms:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no VM {vm_id!r}")
        return self.vms[vm_id]

    def Validate(self, request: Any, context: Any) -> pb.ValidateResponse:
        return pb.ValidateResponse(ok=True, message="broken on purpose")

    def GetCapabilities(self, request: Any, context: Any) -> pb.GetCapabilitiesResponse:
        return pb.GetCapabilitiesResponse(  # claims it does not keep
            supports_snapshots=True,
            supports_disk_export=self._claims_transfers,
            supports_disk_import=self._claims_transfers,
        )

    def ListVMs(self, request: Any, context: Any) -> pb.ListVMsResponse:
        return pb.ListVMsResponse(
            vms=[
                pb.VMInfo(
                    id=vm_id,
                    name=vm.name,
                    power_state="On" if vm.on else "Off",
                    cpu=vm.cpu,
                    memory_mib=vm.memory_mib,
                )
                for vm_id, vm in list(self.vms.items())
            ]
        )

    def Describe(self, request: Any, context: grpc.ServicerContext) -> pb.DescribeResponse:
        vm = self.vms.get(request.id)
        if vm is None:  # the fault: a missing VM must be exists=false
            context.abort(grpc.StatusCode.UNKNOWN, "vm lookup failed")
        return pb.DescribeResponse(exists=True, power_state="On" if vm.on else "Off")

    def Create(self, request: Any, context: grpc.ServicerContext) -> pb.CreateResponse:
        if not request.name:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "name: required")
        try:
            vm_class = json.loads(request.class_json)
        except ValueError:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "class_json: not JSON")
        if vm_class["CPU"] < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "class_json.CPU: negative")
        with self._lock:
            for vm_id, vm in self.vms.items():
                if vm.name == request.name:
                    return pb.CreateResponse(id=vm_id)
            vm_id = str(uuid.uuid4())
            self.vms[vm_id] = Vm(request.name, vm_class["CPU"], vm_class["MemoryMiB"])
        return pb.CreateResponse(id=vm_id)

    def Delete(self, request: Any, context: Any) -> pb.TaskResponse:
        self.vms.pop(request.id, None)
        return pb.TaskResponse()

    def Power(self, request: Any, context: grpc.ServicerContext) -> pb.TaskResponse:
        vm = self._vm(request.id, context)
        if request.op == pb.POWER_OP_UNSPECIFIED:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "op: unspecified")
        rebooted_on = not self._reboot_and_disk_faults  # the fault: REBOOT leaves it Off
        vm.on = request.op == pb.POWER_OP_ON or (request.op == pb.POWER_OP_REBOOT and rebooted_on)
        return pb.TaskResponse()

    def Reconfigure(self, request: Any, context: grpc.ServicerContext) -> pb.TaskResponse:
        vm = self._vm(request.id, context)
        vm_class = json.loads(request.desired_json).get("Class") or {}
        vm.cpu = vm_class.get("CPU") or vm.cpu
        vm.memory_mib = vm_class.get("MemoryMiB") or vm.memory_mib
        return pb.TaskResponse()

    def TaskStatus(self, request: Any, context: Any) -> pb.TaskStatusResponse:
        time.sleep(self._task_status_delay)
        return pb.TaskStatusResponse(done=True, error=f"unknown task {request.task.id!r}")

    def _refuse_snapshots(self, vm_id: str, context: grpc.ServicerContext) -> NoReturn:
        self._vm(vm_id, context)
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "snapshots are not implemented")

    def SnapshotCreate(self, request: Any, context: Any) -> pb.SnapshotCreateResponse:
        self._refuse_snapshots(request.vm_id, context)

    def SnapshotDelete(self, request: Any, context: Any) -> pb.TaskResponse:
        self._refuse_snapshots(request.vm_id, context)

    def SnapshotRevert(self, request: Any, context: Any) -> pb.TaskResponse:
        self._refuse_snapshots(request.vm_id, context)

    def Clone(self, request: Any, context: grpc.ServicerContext) -> pb.CloneResponse:
        source = self._vm(request.source_vm_id, context)
        vm_class = json.loads(request.class_json or "{}")  # the CRD spec: {"cpu", "memory"}
        memory = str(vm_class.get("memory", ""))
        memory_mib = int(memory[:-2]) * (1024 if memory.endswith("Gi") else 1) if memory else 0
        target_id = str(uuid.uuid4())
        self.vms[target_id] = Vm(
            request.target_name,
            vm_class.get("cpu") or source.cpu,
            memory_mib or source.memory_mib,
        )
        return pb.CloneResponse(target_vm_id=target_id)

    def HardwareUpgrade(self, request: Any, context: grpc.ServicerContext) -> pb.TaskResponse:
        self._vm(request.id, context)
        return pb.TaskResponse()

    def GetDiskInfo(self, request: Any, context: grpc.ServicerContext) -> pb.GetDiskInfoResponse:
        vm = self._vm(request.vm_id, context)
        path = "" if self._reboot_and_disk_faults else f"/disks/{vm.name}.qcow2"  # the fault
        return pb.GetDiskInfoResponse(
            disk_id="disk-0", format="qcow2", path=path, virtual_size_bytes=DISK_BYTES
        )

    def ExportDisk(self, request: Any, context: grpc.ServicerContext) -> pb.ExportDiskResponse:
        self._vm(request.vm_id, context)
        if not self._claims_transfers:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "export is not implemented")
        return pb.ExportDiskResponse(export_id="export-1", checksum="a" * 64)

    def ImportDisk(self, request: Any, context: grpc.ServicerContext) -> pb.ImportDiskResponse:
        if not self._claims_transfers:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "import is not implemented")
        # not the bytes exported: another checksum
        return pb.ImportDiskResponse(disk_id="disk-1", path="/imported.qcow2", checksum="b" * 64)

    def ImagePrepare(self, request: Any, context: grpc.ServicerContext) -> pb.ImagePrepareResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "images are not implemented")


@contextmanager
def broken_provider(
    task_status_delay: float = 0.0,
    claims_transfers: bool = False,
    reboot_and_disk_faults: bool = False,
) -> Iterator[tuple[str, BrokenProvider]]:
    """The broken provider on a free loopback port: (endpoint, its servicer)."""
    servicer = BrokenProvider(task_status_delay, claims_transfers, reboot_and_disk_faults)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_ProviderServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        server.stop(0)
