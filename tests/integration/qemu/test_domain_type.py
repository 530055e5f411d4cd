"""LIBVIRT_DOMAIN_TYPE=auto on the real libvirtd: what the host offers, once per connection,
said by Validate; an explicit setting still wins."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from typing import Any

from pyrigaud.adapters.hypervisors.libvirt.connection import LibvirtConnection
from pyrigaud.adapters.hypervisors.libvirt.host_capabilities import domain_type_offered
from pyrigaud.adapters.hypervisors.libvirt.storage import PoolSettings
from pyrigaud.domain.models import OwnerMark

from support import ManualClock, ok
from support.libvirt import create_vm, libvirt_test_backend
from support.qemu import QEMU_URI, TEST_POOL, TEST_POOL_PATH, QemuHost

OWNER = OwnerMark(provider="tests/domain-type")
# This host's KVM, when the test runs where QEMU may use it (it does on these machines).
KVM_USABLE = os.access("/dev/kvm", os.R_OK | os.W_OK)


def test_auto_takes_what_the_host_offers_and_validate_says_it(qemu: QemuHost, conn: Any) -> None:
    expected = "kvm" if KVM_USABLE else "qemu"
    connection = LibvirtConnection(QEMU_URI)
    backend = libvirt_test_backend(
        connection,
        ManualClock(),
        domain_type="auto",
        pools=PoolSettings(default_pool=TEST_POOL, default_pool_path=str(TEST_POOL_PATH)),
    )
    try:
        report = backend.health.check()
        assert report.ok
        assert report.message.endswith(f", {expected} (auto) domains")
        request = qemu.request("auto-domain", image=qemu.image)
        vm_id = ok(create_vm(backend, request, OWNER))
        root = ET.fromstring(conn.lookupByUUIDString(vm_id).XMLDesc(0))
        assert root.get("type") == expected
    finally:
        connection.close()


def test_a_host_without_kvm_gets_qemu_domains(conn: Any) -> None:
    """This daemon's own capabilities, with KVM taken away as a host without it reports them."""
    capabilities = ET.fromstring(conn.getCapabilities())
    for arch in capabilities.iter("arch"):
        for domain in arch.findall("domain[@type='kvm']"):
            arch.remove(domain)
    without_kvm = ET.tostring(capabilities, encoding="unicode")
    assert domain_type_offered(without_kvm)[0] == "qemu"
    assert "offers no KVM" in domain_type_offered(without_kvm)[1]
    if KVM_USABLE:
        assert domain_type_offered(conn.getCapabilities())[0] == "kvm"


def test_an_explicit_domain_type_wins(qemu: QemuHost) -> None:
    assert qemu.backend.health.check().message.endswith(", qemu domains")
