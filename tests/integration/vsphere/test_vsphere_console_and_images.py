"""Describe's console link; ImagePrepare is unsupported (VMs come from existing templates)."""

from __future__ import annotations

import pytest
from returns.result import Result

from pyrigaud.application.backend import Backend
from pyrigaud.application.use_cases.prepare_image import PrepareImage
from pyrigaud.domain.errors import ErrorKind, ProviderError
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


class UnreachableImages:
    """An Images port that must never be asked: the capabilities gate ImagePrepare first."""

    def prepare_image(self, request: PrepareImageRequest) -> Result[PreparedImage, ProviderError]:
        raise AssertionError(f"ImagePrepare reached the images port with {request!r}")


@pytest.mark.parametrize(
    "source",
    [
        ImageSource(origin="vsphere", template_name=TEMPLATE_VM),
        ImageSource(origin="vsphere", url="https://images.example/x.ova"),
        ImageSource(origin="vsphere", content_library=ContentLibraryItem(library="l", item="i")),
        ImageSource(origin="libvirt", path="/images/base.qcow2"),
    ],
)
def test_image_prepare_is_unsupported_as_vsphere_imports_no_images(
    backend: Backend, source: ImageSource
) -> None:
    assert backend.images is None
    assert not backend.capabilities.capabilities().supports_image_import
    prepare = PrepareImage(images=UnreachableImages(), capabilities=backend.capabilities)
    result = prepare(PrepareImageRequest(source=source))
    assert error_kind(result) is ErrorKind.UNSUPPORTED
    assert "image import" in error_of(result).message
