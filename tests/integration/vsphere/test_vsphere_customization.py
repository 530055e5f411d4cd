"""Guest customization (fixed IPs, DNS, host name, time zone) and the virtual TPM."""

from __future__ import annotations

import functools
from typing import Any

import pytest
from pyVmomi import vim as untyped_vim

from pyrigaud.adapters.hypervisors.vsphere.customization import guest_customization
from pyrigaud.adapters.hypervisors.vsphere.networks import CLONE_ATTACHMENTS
from pyrigaud.adapters.hypervisors.vsphere.properties import retrieve
from pyrigaud.application.backend import Backend
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.models import (
    CloneRequest,
    Customization,
    Firmware,
    NetworkAttachment,
    OwnerMark,
    SecurityProfile,
    VMClass,
)

from contract.harness import made
from support import error_kind, error_of, ok, present
from support.vsphere import Simulator, template_request, vm_ref

OWNER = OwnerMark(provider="tests/vsphere-customization")
vim: Any = untyped_vim  # pyVmomi's data-object constructors are untyped


request = functools.partial(template_request, cpu=1, memory_mib=256)


def read_vm(simulator: Simulator, vm_id: str, properties: tuple[str, ...]) -> dict[str, Any]:
    session = simulator.session()
    try:
        return session.call(
            lambda instance: retrieve(instance, [vm_ref(instance, vm_id)], properties)
        )[0]
    finally:
        session.close()


def test_create_gives_each_nic_its_fixed_ip_or_dhcp_at_first_boot(
    backend: Backend, simulator: Simulator
) -> None:
    networks = (
        NetworkAttachment(portgroup="VM Network", static_ip="192.0.2.30/24", gateway="192.0.2.1"),
        NetworkAttachment(portgroup="DC0_DVPG0"),
    )
    vm_id = made(
        backend.tasks,
        backend.lifecycle.start_create(request("vs-fixed-ip", networks=networks), OWNER),
    )
    pending = read_vm(simulator, vm_id, ("config.tools.pendingCustomization",))
    assert pending.get("config.tools.pendingCustomization")  # applied at the next boot
    ok(backend.power.power_on(vm_id))
    description = ok(backend.inventory.describe(vm_id))
    assert description is not None
    assert description.ips == ("192.0.2.30",)
    record = ok(backend.lifecycle.find_by_name("vs-fixed-ip"))
    assert record is not None
    assert record.building_since is None  # the mark is cleared after the customization


def test_clone_customization_sets_fixed_ip_dns_and_host_name(
    backend: Backend, simulator: Simulator
) -> None:
    source = made(backend.tasks, backend.lifecycle.start_create(request("vs-cust-src"), OWNER))
    customization = Customization(
        hostname="web-2",
        domain="example.test",
        time_zone="Europe/Berlin",
        networks=(
            NetworkAttachment(
                network_name="VM Network",
                static_ip="192.0.2.40",
                prefix=24,
                gateway="192.0.2.1",
                dns=("192.0.2.53",),
            ),
        ),
    )
    clone = CloneRequest(source_vm_id=source, target_name="vs-cust", customization=customization)
    target = made(backend.tasks, present(backend.cloning).start_clone(clone, OWNER))
    ok(backend.power.power_on(target))
    row = read_vm(simulator, target, ("guest.hostName", "guest.net"))
    assert row["guest.hostName"] == "web-2"
    (nic,) = row["guest.net"]
    assert list(nic.ipAddress) == ["192.0.2.40"]
    assert list(nic.dnsConfig.ipAddress) == ["192.0.2.53"]
    assert list(nic.dnsConfig.searchDomain) == ["example.test"]


def test_the_customization_names_the_time_zone_and_pads_nics_with_dhcp() -> None:
    """The simulator keeps the time zone to itself, so the spec is checked directly."""
    guest = ok(
        guest_customization(
            (NetworkAttachment(static_ip="198.51.100.7/25"),),
            host_name="db-1",
            domain="",
            time_zone="America/New_York",
            named=CLONE_ATTACHMENTS,
        )
    )
    assert guest is not None
    spec = guest.spec(nic_count=2)
    assert spec.identity.timeZone == "America/New_York"
    assert spec.identity.hostName.name == "db-1"
    fixed, dhcp = (mapping.adapter for mapping in spec.nicSettingMap)
    assert (fixed.ip.ipAddress, fixed.subnetMask) == ("198.51.100.7", "255.255.255.128")
    assert isinstance(dhcp.ip, vim.vm.customization.DhcpIpGenerator)
    no_ip = (NetworkAttachment(network_name="VM Network"),)
    none_needed = ok(
        guest_customization(no_ip, host_name="", domain="", time_zone="", named=CLONE_ATTACHMENTS)
    )
    assert none_needed is None


@pytest.mark.parametrize(
    ("customization", "kind", "field"),
    [
        (
            Customization(
                networks=(NetworkAttachment(network_name="VM Network", static_ip="192.0.2.5"),)
            ),
            ErrorKind.INVALID_SPEC,
            f"{fields.customize_network_field(0, 'prefix')}:",
        ),
        (
            Customization(
                networks=(NetworkAttachment(network_name="VM Network", static_ip="2001:db8::5/64"),)
            ),
            ErrorKind.UNSUPPORTED,
            "",
        ),
    ],
)
def test_customization_vsphere_cannot_apply_is_refused_before_cloning(
    backend: Backend, customization: Customization, kind: ErrorKind, field: str
) -> None:
    source = made(backend.tasks, backend.lifecycle.start_create(request("vs-refused-src"), OWNER))
    clone = CloneRequest(source_vm_id=source, target_name="vs-refused", customization=customization)
    result = present(backend.cloning).start_clone(clone, OWNER)
    assert error_kind(result) is kind
    assert error_of(result).message.startswith(field)
    assert ok(backend.lifecycle.find_by_name("vs-refused")) is None


def test_a_virtual_tpm_needs_efi_and_an_api_that_has_one(backend: Backend) -> None:
    """The simulator speaks API 6.5, older than vTPM (6.7): it is refused, not half-made."""
    with_tpm = SecurityProfile(tpm_enabled=True, tpm_version="2.0")
    efi = VMClass(cpu=1, memory_mib=256, firmware=Firmware.UEFI, security=with_tpm)
    refused = backend.lifecycle.start_create(request("vs-tpm", vm_class=efi), OWNER)
    assert error_kind(refused) is ErrorKind.UNSUPPORTED
    assert "needs vSphere 6.7" in error_of(refused).message
    bios = VMClass(cpu=1, memory_mib=256, security=with_tpm)
    refused = backend.lifecycle.start_create(request("vs-tpm-bios", vm_class=bios), OWNER)
    assert error_kind(refused) is ErrorKind.INVALID_SPEC
    assert error_of(refused).message.startswith(f"{fields.CLASS_TPM_ENABLED}:")
    tpm_1 = efi.model_copy(
        update={"security": SecurityProfile(tpm_enabled=True, tpm_version="1.2")}
    )
    refused = backend.lifecycle.start_create(request("vs-tpm-old", vm_class=tpm_1), OWNER)
    assert error_of(refused).message.startswith(f"{fields.CLASS_TPM_VERSION}:")
    for name in ("vs-tpm", "vs-tpm-bios", "vs-tpm-old"):
        assert ok(backend.lifecycle.find_by_name(name)) is None
