"""What a VM made from an imported disk boots on: decided here, once, for every backend.

The manager makes a migration's target with Create, from its target class and the imported
disk's Path; nothing of the source's hardware is in the request. What the import learned (the
source's hardware manifest and what the disk's first sectors say it can boot by) is kept in
the import's record beside the disk; this rule reads it into the request before the backend
sees it:

- firmware: the VMClass CRD defaults `firmware` to BIOS, so a class saying BIOS may be nobody's
  choice. A disk that can only boot by UEFI, or whose source booted it by UEFI, gets UEFI;
  a source with secure boot gets it on the target too. Each is a warning, never a refusal.
- devices: `CreateRequest.hardware` carries the guest's hardware, which the backend maps to its
  nearest equivalent; an operator who has converted the guest (virtio drivers in, initramfs
  rebuilt) asks for the target's native devices with the class's extraConfig
  `pyrigaud.devices: native`, and the backend then sees no hardware at all.
"""

from __future__ import annotations

import logging
from enum import StrEnum

from returns.result import Failure, Result, Success

from pyrigaud.domain import fields
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.hardware import BootNeed, Firmware, VirtualHardware
from pyrigaud.domain.models import CreateRequest

# The class's extraConfig key an operator sets to choose the target's devices.
DEVICES_KEY = "pyrigaud.devices"

logger = logging.getLogger(__name__)


class DevicesWanted(StrEnum):
    GUEST = "guest"  # the nearest equivalent of what the guest knows (the default)
    NATIVE = "native"  # the target's own devices (virtio on libvirt): the guest was converted


_WANTED = {wanted.value: wanted for wanted in DevicesWanted}


def devices_wanted(request: CreateRequest) -> Result[DevicesWanted, ProviderError]:
    """The class's choice of devices; a value other than the two is refused naming the key."""
    value = request.vm_class.extra_config.get(DEVICES_KEY, "").strip().lower()
    wanted = _WANTED.get(value or DevicesWanted.GUEST.value)
    if wanted is None:
        choices = ", ".join(repr(choice) for choice in _WANTED)
        return Failure(
            ProviderError.invalid_spec(
                fields.class_extra_config(DEVICES_KEY), f"is {value!r}; use one of {choices}"
            )
        )
    return Success(wanted)


def fitted(
    request: CreateRequest,
    hardware: VirtualHardware | None,
    boot: BootNeed,
    wanted: DevicesWanted,
) -> CreateRequest:
    """`request` with the firmware the imported disk's guest needs and, unless the class asks
    for native devices, the guest's hardware for the backend to match."""
    vm_class = request.vm_class
    firmware = vm_class.firmware
    secure_boot = vm_class.security.secure_boot
    disk = request.image.path
    if firmware is Firmware.BIOS and boot is BootNeed.UEFI_ONLY:
        logger.warning(
            "Create %r: the class says BIOS, but disk %r can only boot by UEFI (a GPT with an "
            "EFI system partition and no BIOS boot code): made UEFI",
            request.name,
            disk,
        )
        firmware = Firmware.UEFI
    elif firmware is Firmware.BIOS and hardware is not None and hardware.firmware is Firmware.UEFI:
        logger.warning(
            "Create %r: the class says BIOS, but disk %r's guest booted by UEFI on %s: made UEFI",
            request.name,
            disk,
            hardware.source_hypervisor,
        )
        firmware = Firmware.UEFI
    if hardware is not None and hardware.secure_boot and firmware is Firmware.UEFI:
        if not secure_boot:
            logger.warning(
                "Create %r: disk %r's guest booted with secure boot on %s: made with it",
                request.name,
                disk,
                hardware.source_hypervisor,
            )
        secure_boot = True
    security = vm_class.security.model_copy(update={"secure_boot": secure_boot})
    return request.model_copy(
        update={
            "vm_class": vm_class.model_copy(update={"firmware": firmware, "security": security}),
            "hardware": hardware if wanted is DevicesWanted.GUEST else None,
        }
    )
