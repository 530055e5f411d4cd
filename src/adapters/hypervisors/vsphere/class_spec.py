"""A VM class (and cloud-init data) as the ConfigSpec that the clone applies.

It travels in the clone spec, so vCenter makes the VM with its class in one task (the test
simulator's launcher applies what the simulator itself ignores there). Only the hardware
version cannot be set in a clone; it is upgraded after the clone, before this spec is applied.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

from pyVmomi import vim as untyped_vim
from returns.result import Failure, Result, Success

from pyrigaud.application.guest_hardware import DEVICES_KEY
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import Firmware, VMClass

# pyVmomi's stubs leave its data-object constructors untyped: use them dynamically.
vim: Any = untyped_vim

HARDWARE_VERSION_KEY = "vsphere.hardwareVersion"
# The class's extraConfig keys that are pyrigaud's to read, not the VM's to carry.
PYRIGAUD_KEYS = frozenset({HARDWARE_VERSION_KEY, DEVICES_KEY})
TPM_VERSIONS = ("", "2", "2.0")
FIRST_TPM_API = (6, 7)


def class_config(
    vm_class: VMClass, owned_by: Mapping[str, str], user_data: bytes, meta_data: bytes
) -> Result[Any, ProviderError]:
    """The ConfigSpec for CPU, memory, firmware, hot-add, nesting and extraConfig."""
    if vm_class.security.tpm_enabled and vm_class.firmware is not Firmware.UEFI:
        return Failure(ProviderError.invalid_spec(fields.CLASS_TPM_ENABLED, "needs firmware UEFI"))
    if vm_class.security.tpm_enabled and vm_class.security.tpm_version not in TPM_VERSIONS:
        return Failure(
            ProviderError.invalid_spec(
                fields.CLASS_TPM_VERSION,
                f"vSphere's virtual TPM is TPM 2.0, got {vm_class.security.tpm_version!r}",
            )
        )
    extra = {key: value for key, value in vm_class.extra_config.items() if key not in PYRIGAUD_KEYS}
    extra.update(guestinfo(user_data, meta_data))
    extra.update(owned_by)  # last, so a class can never forge the ownership mark
    return Success(
        vim.vm.ConfigSpec(
            numCPUs=vm_class.cpu,
            memoryMB=vm_class.memory_mib,
            firmware="efi" if vm_class.firmware is Firmware.UEFI else "bios",
            bootOptions=vim.vm.BootOptions(efiSecureBootEnabled=vm_class.security.secure_boot),
            nestedHVEnabled=vm_class.performance.nested_virtualization,
            cpuHotAddEnabled=vm_class.performance.cpu_hot_add,
            memoryHotAddEnabled=vm_class.performance.memory_hot_add,
            extraConfig=[
                vim.option.OptionValue(key=key, value=value) for key, value in extra.items()
            ],
        )
    )


def class_devices(
    vm_class: VMClass, devices: Sequence[Any], api_version: str
) -> Result[list[Any], ProviderError]:
    """Device additions the class asks for: a virtual TPM, unless the VM has one already.

    `api_version` is the endpoint's (about.apiVersion): before vSphere 6.7 there is no vTPM,
    and pyVmomi would send it as a bare device. vCenter refuses a vTPM without a key
    provider; that fault comes back as the error."""
    has_tpm = any(isinstance(device, vim.vm.device.VirtualTPM) for device in devices)
    if not vm_class.security.tpm_enabled or has_tpm:
        return Success([])
    if _version(api_version) < FIRST_TPM_API:
        return Failure(
            ProviderError.unsupported(
                "a virtual TPM needs vSphere 6.7 or later, and this "
                f"endpoint speaks API {api_version}",
                fields.CLASS_TPM_ENABLED,
            )
        )
    tpm = vim.vm.device.VirtualTPM(key=-300)
    return Success([vim.vm.device.VirtualDeviceSpec(operation="add", device=tpm)])


def _version(api_version: str) -> tuple[int, ...]:
    """ "7.0.3.0" -> (7, 0, 3, 0); what is not a number counts as 0."""
    return tuple(int(part) if part.isdigit() else 0 for part in api_version.split("."))


def guestinfo(user_data: bytes, meta_data: bytes) -> dict[str, str]:
    """cloud-init's VMware datasource keys: base64 data with its encoding named."""
    keys: dict[str, str] = {}
    for name, data in (("userdata", user_data), ("metadata", meta_data)):
        if data:
            keys[f"guestinfo.{name}"] = base64.b64encode(data).decode("ascii")
            keys[f"guestinfo.{name}.encoding"] = "base64"
    return keys


def hardware_version(vm_class: VMClass) -> Result[str | None, ProviderError]:
    """ExtraConfig["vsphere.hardwareVersion"] as vSphere spells it ("19" or "vmx-19")."""
    value = vm_class.extra_config.get(HARDWARE_VERSION_KEY, "").strip()
    if not value:
        return Success(None)
    number = value.removeprefix("vmx-")
    if not number.isdigit():
        return Failure(
            ProviderError.invalid_spec(
                fields.class_extra_config(HARDWARE_VERSION_KEY),
                f"not a hardware version: {value!r}",
            )
        )
    return Success(f"vmx-{int(number):02d}")
