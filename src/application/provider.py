"""Everything the provider can be asked, one use case per RPC, and the stand-in for the use
cases of a port the backend lacks (UNSUPPORTED, naming what). The composition root wires them
(`entrypoints/container.py`); the gRPC servicer calls them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from returns.result import Failure, Result

from pyrigaud.application.ports.vm_lifecycle import CreatedVM
from pyrigaud.application.use_cases.capabilities import GetCapabilities
from pyrigaud.application.use_cases.create_vm import CreateVM
from pyrigaud.application.use_cases.delete_vm import DeleteVM
from pyrigaud.application.use_cases.describe_vm import DescribeVM, ListVMs
from pyrigaud.application.use_cases.power_vm import PowerVM
from pyrigaud.application.use_cases.reconfigure_vm import ReconfigureVM, UpgradeHardware
from pyrigaud.application.use_cases.task_status import TaskStatus
from pyrigaud.application.use_cases.validate import ValidateProvider
from pyrigaud.domain.errors import ProviderError
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
        self._error = ProviderError.not_supported(what)

    def __call__(self, *_: object) -> Result[Any, ProviderError]:
        return Failure(self._error)
