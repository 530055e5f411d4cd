"""The use cases of one provider, each wired from the port of the selected backend it needs.

A port the backend does not have (None in its `Backend`) leaves its use cases answering
UNSUPPORTED, with the message the capability gate gives.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from returns.result import Failure, Result

from pyrigaud.application.backend import Backend
from pyrigaud.application.ownership import OwnershipRule
from pyrigaud.application.ports import Clock
from pyrigaud.application.ports.image_judge import ImageJudge
from pyrigaud.application.ports.staging import StagingStorage
from pyrigaud.application.ports.storage_gate import StorageGate
from pyrigaud.application.ports.transfer_metrics import TransferMetrics
from pyrigaud.application.ports.vm_lifecycle import CreatedVM
from pyrigaud.application.use_cases.capabilities import GetCapabilities
from pyrigaud.application.use_cases.clone_vm import CloneVM
from pyrigaud.application.use_cases.create_vm import CreateVM
from pyrigaud.application.use_cases.delete_vm import DeleteVM
from pyrigaud.application.use_cases.describe_vm import DescribeVM, ListVMs
from pyrigaud.application.use_cases.disks import GetDiskInfo
from pyrigaud.application.use_cases.export_disk import ExportDisk
from pyrigaud.application.use_cases.import_disk import ImportDisk
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
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.leftovers import LeftoverPolicy
from pyrigaud.domain.models import (
    CloneRequest,
    DiskDetails,
    DiskQuery,
    ExportRequest,
    ExportResult,
    ImportRequest,
    ImportResult,
    PreparedImage,
    PrepareImageRequest,
    Snapshot,
    SnapshotRequest,
)
from pyrigaud.domain.tasks import TaskRef

_Port = TypeVar("_Port")
_UseCase = TypeVar("_UseCase")

_TaskResult = Result[TaskRef | None, ProviderError]


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
    create_snapshot: Callable[[SnapshotRequest], Result[Snapshot, ProviderError]]
    delete_snapshot: Callable[[str, str], _TaskResult]
    revert_snapshot: Callable[[str, str], _TaskResult]
    clone_vm: Callable[[CloneRequest], Result[CreatedVM, ProviderError]]
    prepare_image: Callable[[PrepareImageRequest], Result[PreparedImage, ProviderError]]
    get_capabilities: GetCapabilities
    export_disk: Callable[[ExportRequest], Result[ExportResult, ProviderError]]
    import_disk: Callable[[ImportRequest], Result[ImportResult, ProviderError]]
    get_disk_info: Callable[[DiskQuery], Result[DiskDetails, ProviderError]]
    list_vms: ListVMs


class Unsupported:
    """The use case of a port the backend lacks: always UNSUPPORTED, naming what."""

    def __init__(self, what: str) -> None:
        self._error = ProviderError.unsupported(f"this provider does not support {what}")

    def __call__(self, *_: object) -> Result[Any, ProviderError]:
        return Failure(self._error)


def _served(
    port: _Port | None, what: str, use_case: Callable[[_Port], _UseCase]
) -> _UseCase | Unsupported:
    return Unsupported(what) if port is None else use_case(port)


def provider_use_cases(
    backend: Backend,
    clock: Clock,
    ownership: OwnershipRule,
    *,
    staging: StagingStorage,
    judge: ImageJudge,
    leftovers: LeftoverPolicy,
    transfer_metrics: TransferMetrics,
    storage_gate: StorageGate,
) -> ProviderUseCases:
    """`staging` is where disks move through (`storage_gate` says which of its stores a
    request may name), `judge` tells a staged image's format,
    `leftovers` when a transfer's staged temporaries count as abandoned, and
    `transfer_metrics` what an operator sees of transfers."""
    caps = backend.capabilities
    abandoned = leftovers.transfer_abandoned_after_seconds
    return ProviderUseCases(
        validate=ValidateProvider(backend.health),
        create_vm=CreateVM(backend.lifecycle, ownership),
        delete_vm=DeleteVM(backend.lifecycle),
        power_vm=PowerVM(backend.power, clock),
        reconfigure_vm=ReconfigureVM(backend.lifecycle, backend.inventory),
        upgrade_hardware=UpgradeHardware(backend.lifecycle, caps),
        describe_vm=DescribeVM(backend.inventory),
        task_status=TaskStatus(backend.power, backend.tasks, clock),
        create_snapshot=_served(backend.snapshots, "snapshots", lambda p: CreateSnapshot(p, caps)),
        delete_snapshot=_served(backend.snapshots, "snapshots", lambda p: DeleteSnapshot(p, caps)),
        revert_snapshot=_served(backend.snapshots, "snapshots", lambda p: RevertSnapshot(p, caps)),
        clone_vm=_served(backend.cloning, "cloning", lambda p: CloneVM(p, caps, ownership)),
        prepare_image=_served(
            backend.images, "image import (ImagePrepare)", lambda p: PrepareImage(p, caps)
        ),
        get_capabilities=GetCapabilities(caps),
        export_disk=_served(
            backend.disk_transfer,
            "disk export",
            lambda p: ExportDisk(
                p,
                staging,
                caps,
                storage_gate=storage_gate,
                abandoned_after_seconds=abandoned,
                metrics=transfer_metrics,
            ),
        ),
        import_disk=_served(
            backend.disk_transfer,
            "disk import",
            lambda p: ImportDisk(
                p,
                staging,
                judge,
                caps,
                storage_gate=storage_gate,
                abandoned_after_seconds=abandoned,
                metrics=transfer_metrics,
            ),
        ),
        get_disk_info=_served(backend.disk_transfer, "disk transfer", GetDiskInfo),
        list_vms=ListVMs(backend.inventory),
    )
