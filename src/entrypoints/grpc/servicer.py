"""provider.v1.Provider: proto -> domain, one use case, Result -> response or status code.

Each RPC method only translates; the rules live in the use cases. Every RPC passes through
`_serve`, which applies the caller allow-list, the mutation bound, the status table, the RPC
metrics and the per-RPC log line, and turns an unexpected exception (a bug) into INTERNAL
without crashing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc
from google.protobuf.message import Message
from returns.result import Failure, Result, Success

from pyrigaud.application.ports import Clock
from pyrigaud.application.use_cases.capabilities import GetCapabilities
from pyrigaud.application.use_cases.clone_vm import CloneVM
from pyrigaud.application.use_cases.create_vm import CreateVM
from pyrigaud.application.use_cases.delete_vm import DeleteVM
from pyrigaud.application.use_cases.describe_vm import DescribeVM, ListVMs
from pyrigaud.application.use_cases.disks import ExportDisk, GetDiskInfo, ImportDisk
from pyrigaud.application.use_cases.power_vm import PowerVM
from pyrigaud.application.use_cases.prepare_image import PrepareImage
from pyrigaud.application.use_cases.reconfigure_vm import ReconfigureVM, UpgradeHardware
from pyrigaud.application.use_cases.snapshots import (
    CreateSnapshot,
    DeleteSnapshot,
    RevertSnapshot,
)
from pyrigaud.application.use_cases.task_status import TaskStatus
from pyrigaud.application.use_cases.validate import ValidateProvider
from pyrigaud.domain import payloads
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.tasks import TaskRef
from pyrigaud.entrypoints.grpc import translate
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2_grpc as pb_grpc
from pyrigaud.entrypoints.grpc.limits import MutationLimiter
from pyrigaud.entrypoints.grpc.status import STATUS_BY_KIND
from pyrigaud.entrypoints.grpc.tls import caller_allowed, caller_identity
from pyrigaud.entrypoints.metrics import Metrics

logger = logging.getLogger("pyrigaud.rpc")

_Response = TypeVar("_Response", bound=Message)


@dataclass(frozen=True)
class ProviderUseCases:
    """Everything the servicer can ask the application to do, one use case per RPC."""

    validate: ValidateProvider
    create_vm: CreateVM
    delete_vm: DeleteVM
    power_vm: PowerVM
    reconfigure_vm: ReconfigureVM
    upgrade_hardware: UpgradeHardware
    describe_vm: DescribeVM
    task_status: TaskStatus
    create_snapshot: CreateSnapshot
    delete_snapshot: DeleteSnapshot
    revert_snapshot: RevertSnapshot
    clone_vm: CloneVM
    prepare_image: PrepareImage
    get_capabilities: GetCapabilities
    export_disk: ExportDisk
    import_disk: ImportDisk
    get_disk_info: GetDiskInfo
    list_vms: ListVMs


class ProviderServicer(pb_grpc.ProviderServicer):
    def __init__(
        self,
        use_cases: ProviderUseCases,
        limiter: MutationLimiter,
        clock: Clock,
        allowed_sans: frozenset[str] = frozenset(),
        metrics: Metrics | None = None,
    ) -> None:
        """`metrics` is the container's singleton, the one /metrics serves; without it the
        servicer still counts, into a registry nobody scrapes."""
        self._use = use_cases
        self._limiter = limiter
        self._clock = clock
        self._allowed_sans = allowed_sans
        self._metrics = metrics or Metrics()
        self._metrics.watch_inflight_mutations(lambda: limiter.in_flight)
        self._inflight_rpcs = self._metrics.inflight_rpcs

    # --- reads: no mutation slot, logged at debug ---------------------------------------------

    def Validate(
        self, request: pb.ValidateRequest, context: grpc.ServicerContext
    ) -> pb.ValidateResponse:
        def work() -> Result[pb.ValidateResponse, ProviderError]:
            report = self._use.validate()
            return Success(pb.ValidateResponse(ok=report.ok, message=report.message))

        return self._serve(context, "Validate", work, pb.ValidateResponse)

    def Describe(
        self, request: pb.DescribeRequest, context: grpc.ServicerContext
    ) -> pb.DescribeResponse:
        return self._serve(
            context,
            "Describe",
            lambda: self._use.describe_vm(request.id).map(translate.describe_response),
            pb.DescribeResponse,
        )

    def TaskStatus(
        self, request: pb.TaskStatusRequest, context: grpc.ServicerContext
    ) -> pb.TaskStatusResponse:
        def work() -> Result[pb.TaskStatusResponse, ProviderError]:
            state = self._use.task_status(request.task.id)
            return Success(pb.TaskStatusResponse(done=state.done, error=state.error))

        return self._serve(context, "TaskStatus", work, pb.TaskStatusResponse)

    def GetCapabilities(
        self, request: pb.GetCapabilitiesRequest, context: grpc.ServicerContext
    ) -> pb.GetCapabilitiesResponse:
        return self._serve(
            context,
            "GetCapabilities",
            lambda: Success(translate.capabilities_response(self._use.get_capabilities())),
            pb.GetCapabilitiesResponse,
        )

    def ListVMs(
        self, request: pb.ListVMsRequest, context: grpc.ServicerContext
    ) -> pb.ListVMsResponse:
        return self._serve(
            context,
            "ListVMs",
            lambda: self._use.list_vms().map(
                lambda vms: pb.ListVMsResponse(vms=[translate.vm_info(vm) for vm in vms])
            ),
            pb.ListVMsResponse,
        )

    def GetDiskInfo(
        self, request: pb.GetDiskInfoRequest, context: grpc.ServicerContext
    ) -> pb.GetDiskInfoResponse:
        query = payloads.disk_query(request.vm_id, request.disk_id, request.snapshot_id)
        return self._serve(
            context,
            "GetDiskInfo",
            lambda: self._use.get_disk_info(query).map(translate.disk_info_response),
            pb.GetDiskInfoResponse,
        )

    # --- mutations: bounded, logged at info ---------------------------------------------------

    def Create(self, request: pb.CreateRequest, context: grpc.ServicerContext) -> pb.CreateResponse:
        def work() -> Result[pb.CreateResponse, ProviderError]:
            return (
                payloads.parse_create(
                    name=request.name,
                    class_json=request.class_json,
                    image_json=request.image_json,
                    networks_json=request.networks_json,
                    disks_json=request.disks_json,
                    placement_json=request.placement_json,
                    user_data=request.user_data,
                    meta_data=request.meta_data,
                    tags=request.tags,
                )
                .bind(self._use.create_vm)
                .map(lambda vm: pb.CreateResponse(id=vm.id, task=translate.task_ref(vm.task)))
            )

        return self._serve(context, "Create", work, pb.CreateResponse, mutation=True)

    def Delete(self, request: pb.DeleteRequest, context: grpc.ServicerContext) -> pb.TaskResponse:
        return self._serve(
            context,
            "Delete",
            lambda: self._use.delete_vm(request.id).map(lambda _: pb.TaskResponse()),
            pb.TaskResponse,
            mutation=True,
        )

    def Power(self, request: pb.PowerRequest, context: grpc.ServicerContext) -> pb.TaskResponse:
        def work() -> Result[pb.TaskResponse, ProviderError]:
            return (
                payloads.parse_power_op(request.op, request.graceful_timeout_seconds)
                .bind(lambda parsed: self._use.power_vm(request.id, *parsed))
                .map(_task_response)
            )

        return self._serve(context, "Power", work, pb.TaskResponse, mutation=True)

    def Reconfigure(
        self, request: pb.ReconfigureRequest, context: grpc.ServicerContext
    ) -> pb.TaskResponse:
        def work() -> Result[pb.TaskResponse, ProviderError]:
            return (
                payloads.parse_reconfigure(request.desired_json)
                .bind(lambda changes: self._use.reconfigure_vm(request.id, changes))
                .map(_task_response)
            )

        return self._serve(context, "Reconfigure", work, pb.TaskResponse, mutation=True)

    def HardwareUpgrade(
        self, request: pb.HardwareUpgradeRequest, context: grpc.ServicerContext
    ) -> pb.TaskResponse:
        def work() -> Result[pb.TaskResponse, ProviderError]:
            return (
                payloads.parse_hardware_version(request.target_version)
                .bind(lambda version: self._use.upgrade_hardware(request.id, version))
                .map(_task_response)
            )

        return self._serve(context, "HardwareUpgrade", work, pb.TaskResponse, mutation=True)

    def SnapshotCreate(
        self, request: pb.SnapshotCreateRequest, context: grpc.ServicerContext
    ) -> pb.SnapshotCreateResponse:
        def work() -> Result[pb.SnapshotCreateResponse, ProviderError]:
            default_name = time.strftime("snapshot-%Y%m%d-%H%M%S", time.gmtime(self._clock.now()))
            return (
                payloads.parse_snapshot(
                    vm_id=request.vm_id,
                    name_hint=request.name_hint,
                    description=request.description,
                    include_memory=request.include_memory,
                    default_name=default_name,
                )
                .bind(self._use.create_snapshot)
                .map(lambda snapshot: pb.SnapshotCreateResponse(snapshot_id=snapshot.id))
            )

        return self._serve(
            context, "SnapshotCreate", work, pb.SnapshotCreateResponse, mutation=True
        )

    def SnapshotDelete(
        self, request: pb.SnapshotDeleteRequest, context: grpc.ServicerContext
    ) -> pb.TaskResponse:
        return self._serve(
            context,
            "SnapshotDelete",
            lambda: self._use.delete_snapshot(request.vm_id, request.snapshot_id).map(
                _task_response
            ),
            pb.TaskResponse,
            mutation=True,
        )

    def SnapshotRevert(
        self, request: pb.SnapshotRevertRequest, context: grpc.ServicerContext
    ) -> pb.TaskResponse:
        return self._serve(
            context,
            "SnapshotRevert",
            lambda: self._use.revert_snapshot(request.vm_id, request.snapshot_id).map(
                _task_response
            ),
            pb.TaskResponse,
            mutation=True,
        )

    def Clone(self, request: pb.CloneRequest, context: grpc.ServicerContext) -> pb.CloneResponse:
        def work() -> Result[pb.CloneResponse, ProviderError]:
            return (
                payloads.parse_clone(
                    source_vm_id=request.source_vm_id,
                    target_name=request.target_name,
                    linked=request.linked,
                    class_json=request.class_json,
                    placement_json=request.placement_json,
                    customize_json=request.customize_json,
                )
                .bind(self._use.clone_vm)
                .map(
                    lambda vm: pb.CloneResponse(
                        target_vm_id=vm.id, task=translate.task_ref(vm.task)
                    )
                )
            )

        return self._serve(context, "Clone", work, pb.CloneResponse, mutation=True)

    def ImagePrepare(
        self, request: pb.ImagePrepareRequest, context: grpc.ServicerContext
    ) -> pb.ImagePrepareResponse:
        def work() -> Result[pb.ImagePrepareResponse, ProviderError]:
            return (
                payloads.parse_prepare_image(
                    image_json=request.image_json,
                    target_name=request.target_name,
                    storage_hint=request.storage_hint,
                )
                .bind(self._use.prepare_image)
                .map(
                    lambda image: pb.ImagePrepareResponse(
                        prepared_image_id=image.id, prepared_image_path=image.path
                    )
                )
            )

        return self._serve(context, "ImagePrepare", work, pb.ImagePrepareResponse, mutation=True)

    def ExportDisk(
        self, request: pb.ExportDiskRequest, context: grpc.ServicerContext
    ) -> pb.ExportDiskResponse:
        def work() -> Result[pb.ExportDiskResponse, ProviderError]:
            return (
                payloads.parse_export(
                    vm_id=request.vm_id,
                    disk_id=request.disk_id,
                    snapshot_id=request.snapshot_id,
                    destination_url=request.destination_url,
                    disk_format=request.format,
                    compress=request.compress,
                    credentials=request.credentials,
                    backend_type=request.backend_type,
                    transfer_mode=request.transfer_mode,
                    storage_options_json=request.storage_options_json,
                )
                .bind(self._use.export_disk)
                .map(
                    lambda result: pb.ExportDiskResponse(
                        export_id=result.export_id,
                        estimated_size_bytes=result.estimated_size_bytes,
                        checksum=result.checksum,
                    )
                )
            )

        return self._serve(context, "ExportDisk", work, pb.ExportDiskResponse, mutation=True)

    def ImportDisk(
        self, request: pb.ImportDiskRequest, context: grpc.ServicerContext
    ) -> pb.ImportDiskResponse:
        def work() -> Result[pb.ImportDiskResponse, ProviderError]:
            return (
                payloads.parse_import(
                    source_url=request.source_url,
                    storage_hint=request.storage_hint,
                    disk_format=request.format,
                    target_name=request.target_name,
                    verify_checksum=request.verify_checksum,
                    expected_checksum=request.expected_checksum,
                    credentials=request.credentials,
                    backend_type=request.backend_type,
                    transfer_mode=request.transfer_mode,
                    storage_options_json=request.storage_options_json,
                )
                .bind(self._use.import_disk)
                .map(
                    lambda result: pb.ImportDiskResponse(
                        disk_id=result.disk_id,
                        path=result.path,
                        actual_size_bytes=result.actual_size_bytes,
                        checksum=result.checksum,
                    )
                )
            )

        return self._serve(context, "ImportDisk", work, pb.ImportDiskResponse, mutation=True)

    # --- the one path every RPC takes ---------------------------------------------------------

    def _serve(
        self,
        context: grpc.ServicerContext,
        method: str,
        work: Callable[[], Result[_Response, ProviderError]],
        empty: Callable[[], _Response],
        *,
        mutation: bool = False,
    ) -> _Response:
        started = time.perf_counter()
        self._inflight_rpcs.inc()
        try:
            code, message, response = self._outcome(context, work, mutation)
        finally:
            self._inflight_rpcs.dec()
        self._metrics.record_rpc(method, code, time.perf_counter() - started)
        if code is not grpc.StatusCode.OK:
            context.set_code(code)
            context.set_details(message)
            response = empty()
        level = logging.INFO if mutation else logging.DEBUG
        if code is grpc.StatusCode.INTERNAL:
            level = logging.ERROR
        if logger.isEnabledFor(level):
            logger.log(
                level,
                "rpc %s %s",
                method,
                code.name,
                extra={
                    "rpc_method": method,
                    "grpc_code": code.name,
                    "duration_ms": round((time.perf_counter() - started) * 1000, 3),
                    "peer": caller_identity(context) or context.peer(),
                    **({"error": message} if message else {}),
                },
            )
        return response or empty()

    def _outcome(
        self,
        context: grpc.ServicerContext,
        work: Callable[[], Result[_Response, ProviderError]],
        mutation: bool,
    ) -> tuple[grpc.StatusCode, str, _Response | None]:
        if self._allowed_sans and not caller_allowed(context, self._allowed_sans):
            return grpc.StatusCode.PERMISSION_DENIED, "client certificate not allowed", None
        try:
            if not mutation:
                result = work()
            else:
                with self._limiter.slot(context.time_remaining()) as admission:
                    if not admission:
                        return grpc.StatusCode.RESOURCE_EXHAUSTED, admission.refusal, None
                    result = work()
        except Exception:
            logger.exception("unexpected error (a bug) while serving an RPC")
            return grpc.StatusCode.INTERNAL, "internal error; see the provider's log", None
        match result:
            case Success(response):
                return grpc.StatusCode.OK, "", response
            case Failure(error):
                return STATUS_BY_KIND[error.kind], error.message, None
        raise AssertionError("unreachable")  # pragma: no cover


def _task_response(task: TaskRef | None) -> pb.TaskResponse:
    """The operation's task, or none when it finished within the call."""
    return pb.TaskResponse(task=translate.task_ref(task))
