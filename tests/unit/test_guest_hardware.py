"""The rule for what a VM made from an imported disk boots on (application/guest_hardware.py)."""

from __future__ import annotations

import logging

import pytest
from returns.result import Failure, Success

from pyrigaud.application.guest_hardware import DEVICES_KEY, DevicesWanted, devices_wanted, fitted
from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.hardware import BootNeed, DiskController, Firmware, NicModel, VirtualHardware
from pyrigaud.domain.models import CreateRequest, SecurityProfile, VMClass, VMImage

VSPHERE_GUEST = VirtualHardware(
    source_hypervisor="vsphere",
    disk_controller=DiskController.PVSCSI,
    nic_models=(NicModel.VMXNET3,),
)


def _request(
    firmware: Firmware = Firmware.BIOS, secure_boot: bool = False, **extra: str
) -> CreateRequest:
    vm_class = VMClass(
        cpu=1,
        memory_mib=512,
        firmware=firmware,
        security=SecurityProfile(secure_boot=secure_boot),
        extra_config=extra,
    )
    return CreateRequest(name="moved", vm_class=vm_class, image=VMImage(path="/pool/moved.qcow2"))


def test_a_uefi_only_disk_gets_uefi_though_the_class_says_bios(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        made = fitted(_request(), None, BootNeed.UEFI_ONLY, DevicesWanted.GUEST)
    assert made.vm_class.firmware is Firmware.UEFI
    assert "can only boot by UEFI" in caplog.text


def test_a_disk_bios_can_boot_keeps_the_class_firmware() -> None:
    for boot in (BootNeed.BIOS, BootNeed.UNKNOWN):
        assert fitted(_request(), None, boot, DevicesWanted.GUEST).vm_class.firmware is (
            Firmware.BIOS
        )


def test_the_source_firmware_and_secure_boot_travel(caplog: pytest.LogCaptureFixture) -> None:
    source = VSPHERE_GUEST.model_copy(update={"firmware": Firmware.UEFI, "secure_boot": True})
    with caplog.at_level(logging.WARNING):
        made = fitted(_request(), source, BootNeed.UNKNOWN, DevicesWanted.GUEST)
    assert made.vm_class.firmware is Firmware.UEFI
    assert made.vm_class.security.secure_boot
    assert made.vm_class.refusal() is None
    assert "booted by UEFI on vsphere" in caplog.text
    assert "secure boot" in caplog.text


def test_a_class_asking_uefi_is_never_made_bios() -> None:
    made = fitted(_request(Firmware.UEFI), VSPHERE_GUEST, BootNeed.BIOS, DevicesWanted.GUEST)
    assert made.vm_class.firmware is Firmware.UEFI
    assert not made.vm_class.security.secure_boot


def test_the_guest_hardware_reaches_the_backend_unless_native_devices_are_wanted() -> None:
    assert fitted(_request(), VSPHERE_GUEST, BootNeed.BIOS, DevicesWanted.GUEST).hardware == (
        VSPHERE_GUEST
    )
    assert fitted(_request(), VSPHERE_GUEST, BootNeed.BIOS, DevicesWanted.NATIVE).hardware is None


def test_the_override_key_is_read_and_checked() -> None:
    assert devices_wanted(_request()) == Success(DevicesWanted.GUEST)
    native = _request(**{DEVICES_KEY: " Native "})  # type: ignore[arg-type]
    assert devices_wanted(native) == Success(DevicesWanted.NATIVE)
    match devices_wanted(_request(**{DEVICES_KEY: "virtio"})):  # type: ignore[arg-type]
        case Failure(error):
            assert error.kind is ErrorKind.INVALID_SPEC
            assert error.field == f'vm_class.extra_config["{DEVICES_KEY}"]'
            assert "'guest', 'native'" in error.message
        case other:
            pytest.fail(f"accepted: {other}")
