"""Create: idempotent by name for VMs this provider owns, and safe after a crash part-way.

A VM made around an imported disk (`image.path`) is given what its guest boots on, from the
import's record beside the disk (`application/guest_hardware.py`: the firmware the disk or its
source needs, and the guest's devices for the backend to match)."""

from __future__ import annotations

from functools import partial

from returns.result import Failure, Result, Success

from pyrigaud.application.guest_hardware import DevicesWanted, devices_wanted, fitted
from pyrigaud.application.import_record import ImportRecord, parse_record
from pyrigaud.application.ownership import OwnershipRule
from pyrigaud.application.ports import VMLifecycle
from pyrigaud.application.ports.virtual_hardware import HardwareFacts
from pyrigaud.application.ports.vm_lifecycle import CreatedVM
from pyrigaud.domain.errors import ErrorKind, ProviderError
from pyrigaud.domain.hardware import BootNeed
from pyrigaud.domain.models import CreateRequest, OwnerMark


class CreateVM:
    def __init__(
        self,
        lifecycle: VMLifecycle,
        ownership: OwnershipRule,
        hardware: HardwareFacts | None = None,
    ) -> None:
        self._lifecycle = lifecycle
        self._ownership = ownership
        self._hardware = hardware

    def __call__(self, request: CreateRequest) -> Result[CreatedVM, ProviderError]:
        """Differences between the request and an existing VM are Reconfigure's job, not ours."""
        return self._ownership.make_unless_exists(request.name, partial(self._start, request))

    def _start(self, request: CreateRequest, owner: OwnerMark) -> Result[CreatedVM, ProviderError]:
        """A class no hypervisor can make is refused here, once, for every backend."""
        return Result.do(
            created
            for wanted in devices_wanted(request)
            for fit in self._fitted(request, wanted)
            for allowed in _allowed(fit)
            for created in self._lifecycle.start_create(allowed, owner)
        )

    def _fitted(
        self, request: CreateRequest, wanted: DevicesWanted
    ) -> Result[CreateRequest, ProviderError]:
        """The request with what the imported disk's guest boots on, when its record says."""
        if self._hardware is None or not request.image.path:
            return Success(request)
        return Result.do(
            fitted(
                request,
                record.hardware if record else None,
                record.boot if record else BootNeed.UNKNOWN,
                wanted,
            )
            for record in _import_record(self._hardware, request.image.path)
        )


def _import_record(
    hardware: HardwareFacts, path: str
) -> Result[ImportRecord | None, ProviderError]:
    """The record kept beside the disk at `path`; None when there is none to read (the disk was
    not imported here, or names nothing: Create itself says so)."""
    match hardware.import_record_of(path):
        case Success(bytes() as raw):
            return Success(parse_record(raw))
        case Failure(error) as failed if error.kind is not ErrorKind.NOT_FOUND:
            return failed
    return Success(None)


def _allowed(request: CreateRequest) -> Result[CreateRequest, ProviderError]:
    refusal = request.vm_class.refusal()
    return Success(request) if refusal is None else Failure(refusal)
