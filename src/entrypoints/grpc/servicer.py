"""provider.v1.Provider: a named handler per RPC, and the table that serves them.

Each handler (`ProviderHandlers`, one method named for its RPC) reads its request through the
wire parsers, asks one use case and writes its reply, as a Result. Serving it (`RpcSpec`) is
the same for every RPC: a Failure becomes a status through the one status table (its fields
named the manager's way), and an unexpected exception (a bug) becomes INTERNAL, logged,
without crashing. What applies to every RPC (caller allow-list, mutation limits, metrics, the
per-RPC log line) is done by the interceptors (`interceptors.py`), which read `mutation` from
the table.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeVar

import grpc
from google.protobuf.message import Message
from returns.result import Failure, Result, Success

from pyrigaud.adapters.staging.registry import StagingTypes
from pyrigaud.application.cancellation import serving_call
from pyrigaud.application.ports import Clock
from pyrigaud.application.ports.vm_lifecycle import CreatedVM
from pyrigaud.application.provider import ProviderUseCases
from pyrigaud.domain.default_names import snapshot_name
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import (
    ExportResult,
    ImportResult,
    PreparedImage,
    Snapshot,
    VMDescription,
    VMInfo,
)
from pyrigaud.domain.power import PowerOp
from pyrigaud.domain.remembered import Remembered
from pyrigaud.domain.tasks import TaskRef
from pyrigaud.entrypoints.grpc import translate, wire
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb
from pyrigaud.entrypoints.grpc.status import STATUS_BY_KIND
from pyrigaud.entrypoints.grpc.wire.field_names import for_the_manager

logger = logging.getLogger("pyrigaud.rpc")

SERVICE = pb.DESCRIPTOR.services_by_name["Provider"].full_name

_Request = TypeVar("_Request", bound=Message)
# A reply: a message, or one serialized before (bytes: Describe's, remembered per VM).
_Response = TypeVar("_Response", bound=Message | bytes)
_Answer = Result[_Response, ProviderError]


@dataclass(frozen=True)
class RpcSpec(Generic[_Request, _Response]):
    """One RPC: its handler, and whether it is a read or a mutation."""

    name: str
    request: type[_Request]
    response: type[_Response]
    handle: Callable[[_Request], Result[_Response, ProviderError]]
    mutation: bool = False
    cancellable: bool = False  # a long call that stops when its client is gone

    def serve(self, request: _Request, context: grpc.ServicerContext) -> _Response:
        try:
            if self.cancellable:
                with serving_call(context.is_active):
                    answered = self.handle(request)
            else:
                # Outside `serving_call` a call counts as active: a read pays nothing for it.
                answered = self.handle(request)
            # Success first: a class pattern that matches the exact type costs no call into
            # the ABC metaclass's isinstance (a Python frame); a miss does (bench: Describe).
            match answered:
                case Success(answer):
                    response: _Response = answer  # the handler's reply, typed by its Result
                    return response
                case Failure(ProviderError() as error):
                    context.set_code(STATUS_BY_KIND[error.kind])
                    context.set_details(for_the_manager(error))
            return self.response()
        except Exception:
            logger.exception("unexpected error (a bug) while serving an RPC")
            context.set_code(grpc.StatusCode.INTERNAL)
            context.set_details("internal error; see the provider's log")
            return self.response()


AnyRpc = RpcSpec[Any, Any]


def provider_rpcs(
    use: ProviderUseCases, clock: Clock, staging_types: StagingTypes
) -> tuple[AnyRpc, ...]:
    """Every RPC of provider.v1.Provider; reads first (they take no mutation slot). The
    transfers' requests name one of `staging_types`."""
    handle = ProviderHandlers(use, clock, staging_types)
    return (
        # --- reads: no mutation slot, logged at debug ---------------------------------------
        RpcSpec("Validate", pb.ValidateRequest, pb.ValidateResponse, handle.validate),
        # Describe's reply is remembered serialized (`ProviderHandlers.describe`): sent as it is.
        RpcSpec("Describe", pb.DescribeRequest, bytes, handle.describe),
        RpcSpec("TaskStatus", pb.TaskStatusRequest, pb.TaskStatusResponse, handle.task_status),
        RpcSpec(
            "GetCapabilities",
            pb.GetCapabilitiesRequest,
            pb.GetCapabilitiesResponse,
            handle.get_capabilities,
        ),
        RpcSpec("ListVMs", pb.ListVMsRequest, pb.ListVMsResponse, handle.list_vms),
        RpcSpec("GetDiskInfo", pb.GetDiskInfoRequest, pb.GetDiskInfoResponse, handle.get_disk_info),
        # --- mutations: bounded, logged at info -----------------------------------------------
        RpcSpec("Create", pb.CreateRequest, pb.CreateResponse, handle.create, mutation=True),
        RpcSpec("Delete", pb.DeleteRequest, pb.TaskResponse, handle.delete, mutation=True),
        RpcSpec("Power", pb.PowerRequest, pb.TaskResponse, handle.power, mutation=True),
        RpcSpec(
            "Reconfigure", pb.ReconfigureRequest, pb.TaskResponse, handle.reconfigure, mutation=True
        ),
        RpcSpec(
            "HardwareUpgrade",
            pb.HardwareUpgradeRequest,
            pb.TaskResponse,
            handle.hardware_upgrade,
            mutation=True,
        ),
        RpcSpec(
            "SnapshotCreate",
            pb.SnapshotCreateRequest,
            pb.SnapshotCreateResponse,
            handle.snapshot_create,
            mutation=True,
        ),
        RpcSpec(
            "SnapshotDelete",
            pb.SnapshotDeleteRequest,
            pb.TaskResponse,
            handle.snapshot_delete,
            mutation=True,
        ),
        RpcSpec(
            "SnapshotRevert",
            pb.SnapshotRevertRequest,
            pb.TaskResponse,
            handle.snapshot_revert,
            mutation=True,
        ),
        RpcSpec("Clone", pb.CloneRequest, pb.CloneResponse, handle.clone, mutation=True),
        RpcSpec(
            "ImagePrepare",
            pb.ImagePrepareRequest,
            pb.ImagePrepareResponse,
            handle.image_prepare,
            mutation=True,
        ),
        RpcSpec(
            "ExportDisk",
            pb.ExportDiskRequest,
            pb.ExportDiskResponse,
            handle.export_disk,
            mutation=True,
            cancellable=True,
        ),
        RpcSpec(
            "ImportDisk",
            pb.ImportDiskRequest,
            pb.ImportDiskResponse,
            handle.import_disk,
            mutation=True,
            cancellable=True,
        ),
    )


class ProviderHandlers:
    """One handler per RPC, named for it: read the request (any request can be read as it is,
    or parsing refuses it: INVALID_ARGUMENT naming the field), ask the use case, write the
    reply. A Failure is handed back as it is, for `RpcSpec` to make a status of."""

    def __init__(self, use: ProviderUseCases, clock: Clock, staging_types: StagingTypes) -> None:
        self._use = use
        self._clock = clock
        self._staging_types = staging_types
        # Each VM's reply, serialized, made again only when its description changes (it
        # rarely does between two of the manager's Describes, ten seconds apart).
        self._describe_replies = Remembered(_serialized_describe_response)

    # --- reads ------------------------------------------------------------------------------

    def validate(self, _request: pb.ValidateRequest) -> _Answer[pb.ValidateResponse]:
        report = self._use.validate()
        return Success(pb.ValidateResponse(ok=report.ok, message=report.message))

    def describe(self, request: pb.DescribeRequest) -> _Answer[bytes]:
        """The hot read: the id as it is (any id can be read; no parse, no Result made)."""
        vm_id = request.id
        return self._use.describe_vm(vm_id).map(lambda found: self._describe_replies(vm_id, found))

    def task_status(self, request: pb.TaskStatusRequest) -> _Answer[pb.TaskStatusResponse]:
        state = self._use.task_status(request.task.id)
        return Success(pb.TaskStatusResponse(done=state.done, error=state.error))

    def get_capabilities(
        self, _request: pb.GetCapabilitiesRequest
    ) -> _Answer[pb.GetCapabilitiesResponse]:
        return Success(translate.capabilities_response(self._use.get_capabilities()))

    def list_vms(self, _request: pb.ListVMsRequest) -> _Answer[pb.ListVMsResponse]:
        return self._use.list_vms().map(_list_response)

    def get_disk_info(self, request: pb.GetDiskInfoRequest) -> _Answer[pb.GetDiskInfoResponse]:
        query = wire.disk_query(request.vm_id, request.disk_id, request.snapshot_id)
        return self._use.get_disk_info(query).map(translate.disk_info_response)

    # --- mutations ----------------------------------------------------------------------------

    def create(self, request: pb.CreateRequest) -> _Answer[pb.CreateResponse]:
        parsed = wire.parse_create(
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
        return parsed.bind(self._use.create_vm).map(_create_response)

    def delete(self, request: pb.DeleteRequest) -> _Answer[pb.TaskResponse]:
        return self._use.delete_vm(request.id).map(_no_task_response)

    def power(self, request: pb.PowerRequest) -> _Answer[pb.TaskResponse]:
        def power_vm(parsed: tuple[PowerOp, int]) -> Result[TaskRef | None, ProviderError]:
            return self._use.power_vm(request.id, *parsed)

        parsed = wire.parse_power_op(request.op, request.graceful_timeout_seconds)
        return parsed.bind(power_vm).map(_task_response)

    def reconfigure(self, request: pb.ReconfigureRequest) -> _Answer[pb.TaskResponse]:
        parsed = wire.parse_reconfigure(request.desired_json)
        return parsed.bind(partial(self._use.reconfigure_vm, request.id)).map(_task_response)

    def hardware_upgrade(self, request: pb.HardwareUpgradeRequest) -> _Answer[pb.TaskResponse]:
        parsed = wire.parse_hardware_version(request.target_version)
        return parsed.bind(partial(self._use.upgrade_hardware, request.id)).map(_task_response)

    def snapshot_create(
        self, request: pb.SnapshotCreateRequest
    ) -> _Answer[pb.SnapshotCreateResponse]:
        parsed = wire.parse_snapshot(
            vm_id=request.vm_id,
            name_hint=request.name_hint,
            description=request.description,
            include_memory=request.include_memory,
            default_name=snapshot_name(self._clock.now()),
        )
        return parsed.bind(self._use.create_snapshot).map(_snapshot_response)

    def snapshot_delete(self, request: pb.SnapshotDeleteRequest) -> _Answer[pb.TaskResponse]:
        deleted = self._use.delete_snapshot(request.vm_id, request.snapshot_id)
        return deleted.map(_task_response)

    def snapshot_revert(self, request: pb.SnapshotRevertRequest) -> _Answer[pb.TaskResponse]:
        reverted = self._use.revert_snapshot(request.vm_id, request.snapshot_id)
        return reverted.map(_task_response)

    def clone(self, request: pb.CloneRequest) -> _Answer[pb.CloneResponse]:
        parsed = wire.parse_clone(
            source_vm_id=request.source_vm_id,
            target_name=request.target_name,
            linked=request.linked,
            class_json=request.class_json,
            placement_json=request.placement_json,
            customize_json=request.customize_json,
        )
        return parsed.bind(self._use.clone_vm).map(_clone_response)

    def image_prepare(self, request: pb.ImagePrepareRequest) -> _Answer[pb.ImagePrepareResponse]:
        parsed = wire.parse_prepare_image(
            image_json=request.image_json,
            target_name=request.target_name,
            storage_hint=request.storage_hint,
        )
        return parsed.bind(self._use.prepare_image).map(_prepared_response)

    def export_disk(self, request: pb.ExportDiskRequest) -> _Answer[pb.ExportDiskResponse]:
        parsed = wire.parse_export(
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
            staging_types=self._staging_types,
        )
        return parsed.bind(self._use.export_disk).map(_export_response)

    def import_disk(self, request: pb.ImportDiskRequest) -> _Answer[pb.ImportDiskResponse]:
        parsed = wire.parse_import(
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
            staging_types=self._staging_types,
        )
        return parsed.bind(self._use.import_disk).map(_import_response)


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
            # A reply already serialized (bytes) goes out as it is.
            response_serializer=None if rpc.response is bytes else rpc.response.SerializeToString,
        )
        for rpc in rpcs
    }
    missing = set(pb.DESCRIPTOR.services_by_name["Provider"].methods_by_name) - set(handlers)
    if missing:
        raise ValueError(f"no spec for {', '.join(sorted(missing))}")
    return handlers


def _serialized_describe_response(found: VMDescription | None) -> bytes:
    return translate.describe_response(found).SerializeToString()


def _list_response(vms: list[VMInfo]) -> pb.ListVMsResponse:
    return pb.ListVMsResponse(vms=[translate.vm_info(vm) for vm in vms])


def _create_response(vm: CreatedVM) -> pb.CreateResponse:
    return pb.CreateResponse(id=vm.id, task=translate.task_ref(vm.task))


def _no_task_response(_done: None) -> pb.TaskResponse:
    return pb.TaskResponse()


def _task_response(task: TaskRef | None) -> pb.TaskResponse:
    """The operation's task, or none when it finished within the call."""
    return pb.TaskResponse(task=translate.task_ref(task))


def _snapshot_response(snapshot: Snapshot) -> pb.SnapshotCreateResponse:
    return pb.SnapshotCreateResponse(snapshot_id=snapshot.id)


def _clone_response(vm: CreatedVM) -> pb.CloneResponse:
    return pb.CloneResponse(target_vm_id=vm.id, task=translate.task_ref(vm.task))


def _prepared_response(image: PreparedImage) -> pb.ImagePrepareResponse:
    return pb.ImagePrepareResponse(prepared_image_id=image.id, prepared_image_path=image.path)


def _export_response(result: ExportResult) -> pb.ExportDiskResponse:
    return pb.ExportDiskResponse(
        export_id=result.export_id,
        estimated_size_bytes=result.estimated_size_bytes,
        checksum=result.checksum,
    )


def _import_response(result: ImportResult) -> pb.ImportDiskResponse:
    return pb.ImportDiskResponse(
        disk_id=result.disk_id,
        path=result.path,
        actual_size_bytes=result.actual_size_bytes,
        checksum=result.checksum,
    )
