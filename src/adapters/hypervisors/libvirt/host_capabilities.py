"""What the host offers: the domain type `auto` means on it (KVM when the host has it), and
whether it can give a VM class the firmware it asks for: UEFI, secure boot, a vTPM.

`auto` asks the connection's host capabilities once per connection: `kvm` when an hvm guest of
the host's own architecture may run under KVM, else `qemu` (QEMU emulating the CPU: nested
clouds, CI runners, virtualisation off in firmware), and `test` on libvirt's test driver. An
explicit LIBVIRT_DOMAIN_TYPE wins.


Asked of libvirt's domain capabilities for the domain type and machine pyrigaud defines (q35
for secure boot, which needs SMM; else the host's default machine), before anything is made, so
a class the host cannot honour is refused by name instead of failing half-way or being quietly
ignored.
Domain capabilities take QEMU a while to answer: they are kept per connection (a reopened
connection asks again, e.g. after firmware was installed on the host).
"""

from __future__ import annotations

import logging
import threading
import weakref
import xml.etree.ElementTree as ET
from functools import partial

import libvirt
from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.libvirt.calls import or_none
from pyrigaud.adapters.hypervisors.libvirt.connection import VirConnect
from pyrigaud.adapters.hypervisors.libvirt.domain_xml import SECURE_BOOT_MACHINE
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import Firmware, VMClass

TPM_VERSIONS = ("2.0", "1.2")
# tpm-crb is the 2.0 interface; 1.2 only exists as tpm-tis.
TPM_MODEL_BY_VERSION = {"2.0": "tpm-crb", "1.2": "tpm-tis"}

# Drivers without domain capabilities (the test driver) validate the XML themselves.
_UNANSWERED_CODES = frozenset({libvirt.VIR_ERR_NO_SUPPORT, libvirt.VIR_ERR_OPERATION_UNSUPPORTED})

AUTO = "auto"

_lock = threading.Lock()
_by_connection: weakref.WeakKeyDictionary[
    object, dict[tuple[str, str | None], ET.Element | None]
] = weakref.WeakKeyDictionary()
_auto_by_connection: weakref.WeakKeyDictionary[object, str] = weakref.WeakKeyDictionary()

logger = logging.getLogger(__name__)


def domain_type_for(conn: VirConnect, configured: str) -> str:
    """The domain type VMs get on this connection: `configured`, or for `auto` what the host
    offers (asked once per connection, and said in one log line)."""
    if configured != AUTO:
        return configured
    with _lock:
        known = _auto_by_connection.get(conn)
    if known is not None:
        return known
    offered, why = domain_type_offered(str(conn.getCapabilities()))
    with _lock:
        first = conn not in _auto_by_connection
        _auto_by_connection[conn] = offered
    if first:
        logger.info("LIBVIRT_DOMAIN_TYPE=auto: VMs are %s domains on this host (%s)", offered, why)
    return offered


def domain_type_offered(capabilities_xml: str) -> tuple[str, str]:
    """What `auto` means on a host of these capabilities (libvirt's `virsh capabilities`), and
    why, for the log line and Validate."""
    root = ET.fromstring(capabilities_xml)  # noqa: S314 - libvirt's own output
    host_arch = root.findtext("host/cpu/arch", "")
    offered = {
        str(domain.get("type"))
        for guest in root.findall("guest")
        if guest.findtext("os_type") == "hvm"
        for arch in guest.findall("arch")
        if not host_arch or arch.get("name") == host_arch
        for domain in arch.findall("domain")
    }
    if "kvm" in offered:
        return "kvm", "the host offers KVM"
    if "test" in offered:
        return "test", "libvirt's test driver"
    return "qemu", (
        "the host offers no KVM: QEMU emulates the CPU (no usable /dev/kvm: a nested cloud, "
        "a CI runner, virtualisation off in firmware)"
    )


def tpm_version_of(vm_class: VMClass) -> str:
    """The TPM version the domain gets: "" for none; an unset version means 2.0."""
    if not vm_class.security.tpm_enabled:
        return ""
    return vm_class.security.tpm_version.strip() or "2.0"


def check_firmware(
    conn: VirConnect, vm_class: VMClass, domain_type: str
) -> Result[None, ProviderError]:
    """A Failure naming the field the host cannot honour; BIOS-only costs nothing."""
    security = vm_class.security
    uefi = vm_class.firmware is Firmware.UEFI
    tpm_version = tpm_version_of(vm_class)
    if tpm_version and tpm_version not in TPM_VERSIONS:
        return Failure(
            ProviderError.invalid_spec(
                fields.CLASS_TPM_VERSION, f"must be one of {', '.join(TPM_VERSIONS)}"
            )
        )
    if not (uefi or tpm_version):
        return Success(None)
    machine_asked = SECURE_BOOT_MACHINE if security.secure_boot else None
    capabilities = _domain_capabilities(conn, domain_type, machine_asked)
    if capabilities is None:
        return Success(None)
    machine = capabilities.findtext("machine", "the default machine")
    where = f"this host ({domain_type} on {machine})"
    if uefi and "efi" not in _values(capabilities, "os[@supported='yes']/enum[@name='firmware']"):
        return Failure(
            ProviderError.failed_precondition(f"firmware UEFI: {where} has no UEFI firmware")
        )
    if security.secure_boot and "yes" not in _values(
        capabilities, "os/loader[@supported='yes']/enum[@name='secure']"
    ):
        return Failure(
            ProviderError.failed_precondition(
                f"{where} has no secure-boot firmware", fields.CLASS_SECURE_BOOT
            )
        )
    if tpm_version:
        tpm = "devices/tpm[@supported='yes']"
        if (
            "emulator" not in _values(capabilities, f"{tpm}/enum[@name='backendModel']")
            or tpm_version not in _values(capabilities, f"{tpm}/enum[@name='backendVersion']")
            or TPM_MODEL_BY_VERSION[tpm_version]
            not in _values(capabilities, f"{tpm}/enum[@name='model']")
        ):
            return Failure(
                ProviderError.failed_precondition(
                    f"{where} cannot emulate a TPM {tpm_version} (it needs swtpm)",
                    fields.CLASS_TPM_ENABLED,
                )
            )
    return Success(None)


def default_machine_is_pcie(conn: VirConnect, domain_type: str) -> bool:
    """Whether a domain without a machine type gets a PCI Express one (q35 is the default on
    some distributions): its hot-plug then needs spare root ports."""
    capabilities = _domain_capabilities(conn, domain_type, None)
    return capabilities is not None and "q35" in capabilities.findtext("machine", "")


def _values(capabilities: ET.Element, path: str) -> set[str]:
    return {value.text or "" for value in capabilities.findall(f"{path}/value")}


def _domain_capabilities(
    conn: VirConnect, domain_type: str, machine: str | None
) -> ET.Element | None:
    """`machine` None: the host's default one."""
    key = (domain_type, machine)
    with _lock:
        known = _by_connection.setdefault(conn, {})
        if key in known:
            return known[key]
    xml = or_none(
        partial(conn.getDomainCapabilities, None, None, machine, domain_type, 0), _UNANSWERED_CODES
    )
    capabilities = None if xml is None else ET.fromstring(xml)  # noqa: S314 - libvirt's own
    with _lock:
        known[key] = capabilities
    return capabilities
