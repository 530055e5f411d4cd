"""Describe's console link, and ImagePrepare as the verification of an existing template."""

from __future__ import annotations

import pytest

from pyrigaud.adapters.hypervisors.vsphere.hypervisor import VSphereHypervisor
from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.models import (
    ContentLibraryItem,
    CreateRequest,
    ImageSource,
    OwnerMark,
    PreparedImage,
    PrepareImageRequest,
    VMClass,
    VMImage,
)

from contract.harness import made
from support import error_kind, error_of, ok
from vsphere_support import TEMPLATE_VM, Simulator

OWNER = OwnerMark(provider="tests/vsphere-console")
SIMULATOR_INSTANCE_UUID = "dbed6e0c-bd88-4ef6-b594-21283e1c677f"  # govmomi's VPX model


def test_describe_links_the_vm_page_of_the_vsphere_client(
    adapter: VSphereHypervisor, simulator: Simulator
) -> None:
    request = CreateRequest(
        name="vs-console",
        vm_class=VMClass(cpu=1, memory_mib=256),
        image=VMImage(template_name=TEMPLATE_VM),
    )
    vm_id = made(adapter, adapter.start_create(request, OWNER))
    description = ok(adapter.describe(vm_id))
    assert description is not None
    moref = description.raw["moref"]
    origin = simulator.endpoint.removesuffix("/sdk")
    assert description.console_url == (
        f"{origin}/ui/#?extensionId=vsphere.core.vm.summary"
        f"&objectId=urn:vmomi:VirtualMachine:{moref}:{SIMULATOR_INSTANCE_UUID}"
    )


def test_prepare_image_verifies_an_existing_template_by_name(adapter: VSphereHypervisor) -> None:
    assert not adapter.capabilities().supports_image_import  # nothing is imported
    found = PrepareImageRequest(source=ImageSource(origin="vsphere", template_name=TEMPLATE_VM))
    assert ok(adapter.prepare_image(found)) == PreparedImage(id=TEMPLATE_VM)
    missing = PrepareImageRequest(source=ImageSource(origin="vsphere", template_name="no-such"))
    result = adapter.prepare_image(missing)
    assert error_kind(result) is ErrorKind.NOT_FOUND
    assert "'no-such'" in error_of(result).message


@pytest.mark.parametrize(
    ("source", "says"),
    [
        (ImageSource(origin="vsphere", url="https://images.example/x.ova"), "OVA/OVF"),
        (
            ImageSource(
                origin="vsphere", content_library=ContentLibraryItem(library="l", item="i")
            ),
            "content library",
        ),
        (ImageSource(origin="libvirt", path="/images/base.qcow2"), "templateName"),
    ],
)
def test_image_imports_are_unsupported_with_a_reason(
    adapter: VSphereHypervisor, source: ImageSource, says: str
) -> None:
    result = adapter.prepare_image(PrepareImageRequest(source=source))
    assert error_kind(result) is ErrorKind.UNSUPPORTED
    assert says in error_of(result).message
