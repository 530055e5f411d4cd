"""The hardware manifest: what a guest boots on (`VirtualHardware`), written by an export
beside the staged disk so that the import on the other side can give the guest the hardware it
knows.

It is a small JSON object (sorted keys): `kind` and `version` say what it is, `disk_sha256`
binds it to the staged disk it describes, `hardware` holds the fields. The staging area is
shared and may hold anything, so reading one never raises and never trusts it: a manifest is
ignored (None, and the reason, for a log line) when it is larger than MAX_MANIFEST_BYTES, not
JSON, not an object, of another kind or version, has a field of the wrong type or a text above
MAX_TEXT_CHARS, or names another disk than the one staged (a manifest left over from an earlier
export of the same name). An enum value this release does not know (a newer release's
controller or NIC) reads as unknown (None), not a rejection; an unknown firmware reads as BIOS,
which forces nothing on the target: only UEFI is acted on.
"""

from __future__ import annotations

import json
import re
from enum import StrEnum
from typing import Any, TypeVar

from pyrigaud.domain.hardware import DiskController, Firmware, NicModel, VirtualHardware

# Beside the staged object `<name>`: `<name>.hardware.json`.
MANIFEST_SUFFIX = ".hardware.json"
KIND = "pyrigaud.hardware-manifest"
VERSION = 1
MAX_MANIFEST_BYTES = 16 * 1024
MAX_TEXT_CHARS = 256  # a hypervisor name, a machine type, a guest OS id
_SHA256 = re.compile(r"[0-9a-f]{64}")
_Member = TypeVar("_Member", bound=StrEnum)


def manifest_name(staged_name: str) -> str:
    """The manifest's name beside the staged object `staged_name`."""
    return staged_name + MANIFEST_SUFFIX


def render(hardware: VirtualHardware, disk_sha256: str) -> bytes:
    """The manifest of the staged disk whose SHA-256 is `disk_sha256`."""
    manifest = {
        "kind": KIND,
        "version": VERSION,
        "disk_sha256": disk_sha256.lower(),
        "hardware": hardware_fields(hardware),
    }
    return json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()


def hardware_fields(hardware: VirtualHardware) -> dict[str, Any]:
    """The hardware as the manifest's `hardware` object (and the import record's) holds it."""
    return {
        "source_hypervisor": hardware.source_hypervisor,
        "firmware": hardware.firmware.value,
        "secure_boot": hardware.secure_boot,
        "disk_controller": _value(hardware.disk_controller),
        "nic_models": [_value(model) for model in hardware.nic_models],
        "machine_type": hardware.machine_type,
        "guest_os": hardware.guest_os,
    }


def read(raw: bytes, staged_sha256: str) -> tuple[VirtualHardware | None, str]:
    """The hardware a manifest describes, and ""; or None and why the manifest is ignored.
    `staged_sha256` is the SHA-256 of the staged disk being imported."""
    if len(raw) > MAX_MANIFEST_BYTES:
        return None, f"it is larger than {MAX_MANIFEST_BYTES} bytes"
    try:
        manifest = json.loads(raw)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None, "it is not JSON"
    if not isinstance(manifest, dict):
        return None, "it is not a JSON object"
    if manifest.get("kind") != KIND or type(manifest.get("version")) is not int:
        return None, f"it is not a {KIND}"
    if manifest["version"] != VERSION:
        return None, f"it is of version {manifest['version']}; this release reads {VERSION}"
    checksum = manifest.get("disk_sha256")
    if not isinstance(checksum, str) or not _SHA256.fullmatch(checksum):
        return None, "its disk_sha256 is not a SHA-256"
    if checksum != staged_sha256.lower():
        return None, "its disk_sha256 is not the staged disk's (a manifest of another export)"
    return hardware_from(manifest.get("hardware"))


def hardware_from(fields: object) -> tuple[VirtualHardware | None, str]:
    """The hardware a `hardware` object holds, and ""; or None and why it cannot be read."""
    if not isinstance(fields, dict):
        return None, "its hardware is not a JSON object"
    texts = {
        name: fields.get(name, "") for name in ("source_hypervisor", "machine_type", "guest_os")
    }
    for name, text in texts.items():
        if type(text) is not str or len(text) > MAX_TEXT_CHARS:
            return None, f"its {name} is not a text of at most {MAX_TEXT_CHARS} characters"
    firmware = fields.get("firmware", Firmware.BIOS.value)
    secure_boot = fields.get("secure_boot", False)
    controller = fields.get("disk_controller")
    nics = fields.get("nic_models", [])
    if type(firmware) is not str:
        return None, "its firmware is not a text"
    if type(secure_boot) is not bool:
        return None, "its secure_boot is not true or false"
    if controller is not None and type(controller) is not str:
        return None, "its disk_controller is not a text or null"
    if type(nics) is not list or any(nic is not None and type(nic) is not str for nic in nics):
        return None, "its nic_models is not a list of texts or nulls"
    hardware = VirtualHardware(
        source_hypervisor=texts["source_hypervisor"],
        firmware=_known(Firmware, firmware) or Firmware.BIOS,
        secure_boot=secure_boot,
        disk_controller=_known(DiskController, controller),
        nic_models=tuple(_known(NicModel, nic) for nic in nics),
        machine_type=texts["machine_type"],
        guest_os=texts["guest_os"],
    )
    return hardware, ""


def _value(member: StrEnum | None) -> str | None:
    return None if member is None else member.value


def _known(kind: type[_Member], value: str | None) -> _Member | None:
    """The member of `kind` named `value`; None for null or a value this release does not
    know (a newer release's)."""
    if value is None:
        return None
    try:
        return kind(value)
    except ValueError:
        return None
