"""provider.v1.Provider as a table: one spec per RPC (parse, use case, response builder).

Each RPC reads its request through the wire parsers, asks one use case, and builds its response;
a Failure becomes a status through the one status table (its fields named the manager's
way), and an unexpected exception (a bug)
becomes INTERNAL, logged, without crashing. What applies to every RPC (caller allow-list,
mutation limits, metrics, the per-RPC log line) is done by the interceptors
(`interceptors.py`), which read `mutation` from this table.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

import grpc
from google.protobuf.message import Message
from returns.result import Failure, Result, Success

from pyrigaud.adapters.staging.registry import StagingTypes
from pyrigaud.application.cancellation import serving_call
from pyrigaud.application.ports import Clock
from pyrigaud.application.provider import ProviderUseCases
from pyrigaud.domain.default_names import snapshot_name
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import DiskQuery
from pyrigaud.domain.tasks import TaskRef
from pyrigaud.entrypoints.grpc import translate, wire
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb
from pyrigaud.entrypoints.grpc.status import STATUS_BY_KIND
from pyrigaud.entrypoints.grpc.wire.field_names import for_the_manager

logger = logging.getLogger("pyrigaud.rpc")

SERVICE = pb.DESCRIPTOR.services_by_name["Provider"].full_name

_Request = TypeVar("_Request", bound=Message)
_Parsed = TypeVar("_Parsed")
_Out = TypeVar("_Out")
_Response = TypeVar("_Response", bound=Message)


@dataclass(frozen=True)
class RpcSpec(Generic[_Request, _Parsed, _Out, _Response]):
    """One RPC: read the request, ask the application, answer; a read or a mutation.

    The request is taken by `read` when any request can be (an id, or nothing at all), or by
    `parse` when taking it can refuse it (INVALID_ARGUMENT naming the field): exactly one is
    given. `read` spares the hot reads a Result made and unpacked again on every call.
    """

    name: str
    request: type[_Request]
    response: type[_Response]
    call: Callable[[_Parsed], Result[_Out, ProviderError]]
    respond: Callable[[_Out], _Response]
    read: Callable[[_Request], _Parsed] | None = None
    parse: Callable[[_Request], Result[_Parsed, ProviderError]] | None = None
    mutation: bool = False
    cancellable: bool = False  # a long call that stops when its client is gone

    def __post_init__(self) -> None:
        if (self.read is None) == (self.parse is None):
            raise ValueError(f"{self.name}: give exactly one of read and parse")

    def serve(self, request: _Request, context: grpc.ServicerContext) -> _Response:
        try:
            if self.cancellable:
                with serving_call(context.is_active):
                    return self._answer(request, context)
            # Outside `serving_call` a call counts as active: a read pays nothing for it.
            return self._answer(request, context)
        except Exception:
            logger.exception("unexpected error (a bug) while serving an RPC")
            context.set_code(grpc.StatusCode.INTERNAL)
            context.set_details("internal error; see the provider's log")
            return self.response()

    def _answer(self, request: _Request, context: grpc.ServicerContext) -> _Response:
        if self.read is not None:
            result = self.call(self.read(request))
        else:
            parse = cast(Callable[[_Request], Result[_Parsed, ProviderError]], self.parse)
            result = parse(request).bind(self.call)
        # Success first: a class pattern that matches the exact type costs no call into the
        # ABC metaclass's isinstance (a Python frame); a miss does (bench: Describe).
        match result:
            case Success(answer):
                return self.respond(answer)
            case Failure(ProviderError() as error):
                context.set_code(STATUS_BY_KIND[error.kind])
                context.set_details(for_the_manager(error))
        return self.response()


AnyRpc = RpcSpec[Any, Any, Any, Any]


def provider_rpcs(
    use: ProviderUseCases, clock: Clock, staging_types: StagingTypes
) -> tuple[AnyRpc, ...]:
    """Every RPC of provider.v1.Provider; reads first (they take no mutation slot). The
    transfers' requests name one of `staging_types`."""

    def default_snapshot_name() -> str:
        return snapshot_name(clock.now())

    rpcs: tuple[AnyRpc, ...] = (
        # --- reads: no mutation slot, logged at debug ---------------------------------------
        RpcSpec(
            "Validate",
            pb.ValidateRequest,
            pb.ValidateResponse,
            read=_nothing,
            call=lambda _: Success(use.validate()),
            respond=lambda report: pb.ValidateResponse(ok=report.ok, message=report.message),
        ),
        RpcSpec(
            "Describe",
            pb.DescribeRequest,
            pb.DescribeResponse,
            read=lambda request: request.id,
            call=use.describe_vm,
            respond=translate.describe_response,
        ),
        RpcSpec(
            "TaskStatus",
            pb.TaskStatusRequest,
            pb.TaskStatusResponse,
            read=lambda request: request.task.id,
            call=lambda task_id: Success(use.task_status(task_id)),
            respond=lambda state: pb.TaskStatusResponse(done=state.done, error=state.error),
        ),
        RpcSpec(
            "GetCapabilities",
            pb.GetCapabilitiesRequest,
            pb.GetCapabilitiesResponse,
            read=_nothing,
            call=lambda _: Success(use.get_capabilities()),
            respond=translate.capabilities_response,
        ),
        RpcSpec(
            "ListVMs",
            pb.ListVMsRequest,
            pb.ListVMsResponse,
            read=_nothing,
            call=lambda _: use.list_vms(),
            respond=lambda vms: pb.ListVMsResponse(vms=[translate.vm_info(vm) for vm in vms]),
        ),
        RpcSpec(
            "GetDiskInfo",
            pb.GetDiskInfoRequest,
            pb.GetDiskInfoResponse,
            read=_disk_query,
            call=use.get_disk_info,
            respond=translate.disk_info_response,
        ),
        # --- mutations: bounded, logged at info -----------------------------------------------
        RpcSpec(
            "Create",
            pb.CreateRequest,
            pb.CreateResponse,
            parse=lambda request: wire.parse_create(
                name=request.name,
                class_json=request.class_json,
                image_json=request.image_json,
                networks_json=request.networks_json,
                disks_json=request.disks_json,
                placement_json=request.placement_json,
                user_data=request.user_data,
                meta_data=request.meta_data,
                tags=request.tags,
            ),
            call=use.create_vm,
            respond=lambda vm: pb.CreateResponse(id=vm.id, task=translate.task_ref(vm.task)),
            mutation=True,
        ),
        RpcSpec(
            "Delete",
            pb.DeleteRequest,
            pb.TaskResponse,
            read=lambda request: request.id,
            call=use.delete_vm,
            respond=lambda _: pb.TaskResponse(),
            mutation=True,
        ),
        RpcSpec(
            "Power",
            pb.PowerRequest,
            pb.TaskResponse,
            parse=lambda request: wire.parse_power_op(
                request.op, request.graceful_timeout_seconds
            ).map(lambda parsed: (request.id, *parsed)),
            call=lambda args: use.power_vm(*args),
            respond=_task_response,
            mutation=True,
        ),
        RpcSpec(
            "Reconfigure",
            pb.ReconfigureRequest,
            pb.TaskResponse,
            parse=lambda request: wire.parse_reconfigure(request.desired_json).map(
                lambda changes: (request.id, changes)
            ),
            call=lambda args: use.reconfigure_vm(*args),
            respond=_task_response,
            mutation=True,
        ),
        RpcSpec(
            "HardwareUpgrade",
            pb.HardwareUpgradeRequest,
            pb.TaskResponse,
            parse=lambda request: wire.parse_hardware_version(request.target_version).map(
                lambda version: (request.id, version)
            ),
            call=lambda args: use.upgrade_hardware(*args),
            respond=_task_response,
            mutation=True,
        ),
        RpcSpec(
            "SnapshotCreate",
            pb.SnapshotCreateRequest,
            pb.SnapshotCreateResponse,
            parse=lambda request: wire.parse_snapshot(
                vm_id=request.vm_id,
                name_hint=request.name_hint,
                description=request.description,
                include_memory=request.include_memory,
                default_name=default_snapshot_name(),
            ),
            call=use.create_snapshot,
            respond=lambda snapshot: pb.SnapshotCreateResponse(snapshot_id=snapshot.id),
            mutation=True,
        ),
        RpcSpec(
            "SnapshotDelete",
            pb.SnapshotDeleteRequest,
            pb.TaskResponse,
            read=lambda request: (request.vm_id, request.snapshot_id),
            call=lambda ids: use.delete_snapshot(*ids),
            respond=_task_response,
            mutation=True,
        ),
        RpcSpec(
            "SnapshotRevert",
            pb.SnapshotRevertRequest,
            pb.TaskResponse,
            read=lambda request: (request.vm_id, request.snapshot_id),
            call=lambda ids: use.revert_snapshot(*ids),
            respond=_task_response,
            mutation=True,
        ),
        RpcSpec(
            "Clone",
            pb.CloneRequest,
            pb.CloneResponse,
            parse=lambda request: wire.parse_clone(
                source_vm_id=request.source_vm_id,
                target_name=request.target_name,
                linked=request.linked,
                class_json=request.class_json,
                placement_json=request.placement_json,
                customize_json=request.customize_json,
            ),
            call=use.clone_vm,
            respond=lambda vm: pb.CloneResponse(
                target_vm_id=vm.id, task=translate.task_ref(vm.task)
            ),
            mutation=True,
        ),
        RpcSpec(
            "ImagePrepare",
            pb.ImagePrepareRequest,
            pb.ImagePrepareResponse,
            parse=lambda request: wire.parse_prepare_image(
                image_json=request.image_json,
                target_name=request.target_name,
                storage_hint=request.storage_hint,
            ),
            call=use.prepare_image,
            respond=lambda image: pb.ImagePrepareResponse(
                prepared_image_id=image.id, prepared_image_path=image.path
            ),
            mutation=True,
        ),
        RpcSpec(
            "ExportDisk",
            pb.ExportDiskRequest,
            pb.ExportDiskResponse,
            parse=lambda request: wire.parse_export(
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
                staging_types=staging_types,
            ),
            call=use.export_disk,
            respond=lambda result: pb.ExportDiskResponse(
                export_id=result.export_id,
                estimated_size_bytes=result.estimated_size_bytes,
                checksum=result.checksum,
            ),
            mutation=True,
            cancellable=True,
        ),
        RpcSpec(
            "ImportDisk",
            pb.ImportDiskRequest,
            pb.ImportDiskResponse,
            parse=lambda request: wire.parse_import(
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
                staging_types=staging_types,
            ),
            call=use.import_disk,
            respond=lambda result: pb.ImportDiskResponse(
                disk_id=result.disk_id,
                path=result.path,
                actual_size_bytes=result.actual_size_bytes,
                checksum=result.checksum,
            ),
            mutation=True,
            cancellable=True,
        ),
    )
    return rpcs


Wrap = Callable[[AnyRpc, Callable[[Any, grpc.ServicerContext], Any]], Callable[..., Any]]


def method_handlers(
    rpcs: tuple[AnyRpc, ...], wrap: Wrap = lambda _rpc, behaviour: behaviour
) -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
    """The gRPC handler of each RPC, keyed by method name, its behaviour as `wrap` makes it
    (the interceptors' layers); every method of the proto is served."""
    handlers = {
        rpc.name: grpc.unary_unary_rpc_method_handler(
            wrap(rpc, rpc.serve),
            request_deserializer=rpc.request.FromString,
            response_serializer=rpc.response.SerializeToString,
        )
        for rpc in rpcs
    }
    missing = set(pb.DESCRIPTOR.services_by_name["Provider"].methods_by_name) - set(handlers)
    if missing:
        raise ValueError(f"no spec for {', '.join(sorted(missing))}")
    return handlers


def _nothing(_request: Message) -> None:
    return None


def _disk_query(request: pb.GetDiskInfoRequest) -> DiskQuery:
    return wire.disk_query(request.vm_id, request.disk_id, request.snapshot_id)


def _task_response(task: TaskRef | None) -> pb.TaskResponse:
    """The operation's task, or none when it finished within the call."""
    return pb.TaskResponse(task=translate.task_ref(task))
