"""Firmware requests on the test driver: refused by field when inconsistent, else in the XML.

The test driver has no domain capabilities, so what the host offers is not checked here
(tests/integration/qemu/test_firmware.py does that on the real daemon).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import libvirt
import pytest
from returns.result import Result

from pyrigaud.adapters.hypervisors.libvirt.connection import LibvirtConnection
from pyrigaud.application.backend import Backend
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ErrorKind, ProviderError
from pyrigaud.domain.models import CreateRequest, Firmware, OwnerMark, SecurityProfile, VMClass

from support import ManualClock, error_of, ok
from support.libvirt import create_vm, isolated_host_uri, make_backend

OWNER = OwnerMark(provider="tests/firmware")


@pytest.fixture
def host(tmp_path: Path) -> Iterator[tuple[Backend, LibvirtConnection]]:
    backend, connection = make_backend(isolated_host_uri(tmp_path), ManualClock())
    yield backend, connection
    connection.close()


def create(backend: Backend, name: str, vm_class: VMClass) -> Result[str, ProviderError]:
    return create_vm(backend, CreateRequest(name=name, vm_class=vm_class), OWNER)


def test_an_unknown_tpm_version_is_an_invalid_spec(
    host: tuple[Backend, LibvirtConnection],
) -> None:
    backend, _ = host
    security = SecurityProfile(tpm_enabled=True, tpm_version="3.0")
    error = error_of(create(backend, "tpm-3", VMClass(cpu=1, memory_mib=256, security=security)))
    assert error.kind is ErrorKind.INVALID_SPEC
    assert fields.CLASS_TPM_VERSION in error.message


@pytest.mark.parametrize(("version", "model"), [("", "tpm-crb"), ("1.2", "tpm-tis")])
def test_a_vtpm_is_an_emulated_tpm_device(
    host: tuple[Backend, LibvirtConnection], version: str, model: str
) -> None:
    backend, connection = host
    security = SecurityProfile(tpm_enabled=True, tpm_version=version)
    vm_class = VMClass(cpu=1, memory_mib=256, firmware=Firmware.UEFI, security=security)
    vm_id = ok(create(backend, "with-tpm", vm_class))
    xml = ok(
        connection.call(
            lambda conn: conn.lookupByUUIDString(vm_id).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
        )
    )
    tpm = ET.fromstring(xml).find("devices/tpm")
    assert tpm is not None
    assert tpm.get("model") == model
    tpm_backend = tpm.find("backend")
    assert tpm_backend is not None
    assert (tpm_backend.get("type"), tpm_backend.get("version")) == ("emulator", version or "2.0")
