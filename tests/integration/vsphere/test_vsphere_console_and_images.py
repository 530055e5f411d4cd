"""Describe's console link (ImagePrepare: test_vsphere_image_import.py)."""

from __future__ import annotations

from pyrigaud.application.backend import Backend
from pyrigaud.domain.models import (
    CreateRequest,
    OwnerMark,
    VMClass,
    VMImage,
)

from contract.harness import made
from support import ok
from support.vsphere import TEMPLATE_VM, Simulator

OWNER = OwnerMark(provider="tests/vsphere-console")
SIMULATOR_INSTANCE_UUID = "dbed6e0c-bd88-4ef6-b594-21283e1c677f"  # govmomi's VPX model


def test_describe_links_the_vm_page_of_the_vsphere_client(
    backend: Backend, simulator: Simulator
) -> None:
    request = CreateRequest(
        name="vs-console",
        vm_class=VMClass(cpu=1, memory_mib=256),
        image=VMImage(template_name=TEMPLATE_VM),
    )
    vm_id = made(backend.tasks, backend.lifecycle.start_create(request, OWNER))
    description = ok(backend.inventory.describe(vm_id))
    assert description is not None
    moref = description.raw["moref"]
    origin = simulator.endpoint.removesuffix("/sdk")
    assert description.console_url == (
        f"{origin}/ui/#?extensionId=vsphere.core.vm.summary"
        f"&objectId=urn:vmomi:VirtualMachine:{moref}:{SIMULATOR_INSTANCE_UUID}"
    )
