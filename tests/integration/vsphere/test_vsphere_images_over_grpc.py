"""A `pyrigaud serve` on the vCenter simulator, over gRPC as the manager calls it: the
capabilities claim image import and no disk transfer, ImagePrepare imports the CRD's
`source.vsphere.ovaURL`, and Create accepts the manager's six-key VMImage with a datastore Path."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from pyVim.task import WaitForTask

from pyrigaud.adapters.hypervisors.vsphere.properties import retrieve_all_vms
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2_grpc as pb_grpc

from support.image_server import serving
from support.ova import DATASTORE, ova_of, ovf_descriptor, tiny_disk, write_datastore_file
from support.replica import Replica
from support.vsphere import Simulator

SETTLE_SECONDS = 30


@pytest.fixture
def served(simulator: Simulator, tmp_path: Path) -> Iterator[pb_grpc.ProviderStub]:
    replica = Replica(
        simulator.serve_environ(
            PROVIDER_NAMESPACE="ns",
            PROVIDER_NAME="images",
            PYRIGAUD_IMAGE_URL_ALLOW_LOOPBACK="true",
        ),
        tmp_path / "serve",
    )
    try:
        yield replica.stub
    finally:
        replica.stop()


def _settled(stub: pb_grpc.ProviderStub, task: pb.TaskRef) -> pb.TaskStatusResponse:
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        status = stub.TaskStatus(pb.TaskStatusRequest(task=task))
        if status.done or time.monotonic() > deadline:
            return status
        time.sleep(0.2)


def test_capabilities_claim_image_import_and_disk_transfer(
    served: pb_grpc.ProviderStub,
) -> None:
    capabilities = served.GetCapabilities(pb.GetCapabilitiesRequest())
    assert capabilities.supports_image_import
    assert capabilities.supports_disk_export
    assert capabilities.supports_disk_import
    assert list(capabilities.supported_export_formats) == ["vmdk", "qcow2", "raw"]
    assert list(capabilities.supported_import_formats) == ["vmdk", "qcow2", "raw"]
    assert "pvc" in capabilities.supported_export_backends
    assert list(capabilities.supported_import_backends) == list(
        capabilities.supported_export_backends
    )
    assert list(capabilities.supported_transfer_modes) == ["relay"]


def test_image_prepare_imports_the_ova_url_of_the_crd(
    served: pb_grpc.ProviderStub, simulator: Simulator, tmp_path: Path
) -> None:
    raw, vmdk = tiny_disk(tmp_path)
    ova = ova_of(ovf_descriptor(vmdk, len(raw)), vmdk)
    with serving({"/tiny.ova": ova}) as server:
        source = {
            "ovaURL": server.url("/tiny.ova"),
            "checksum": hashlib.sha512(ova).hexdigest(),
            "checksumType": "sha512",
        }
        request = pb.ImagePrepareRequest(
            image_json=json.dumps({"source": {"vsphere": source}, "prepare": {}}),
            target_name="vs-grpc-ova",
            storage_hint=DATASTORE,
        )
        prepared = served.ImagePrepare(request)
    assert prepared.prepared_image_id == "vs-grpc-ova"
    created = served.Create(
        pb.CreateRequest(
            name="vs-grpc-from-ova",
            class_json=json.dumps({"CPU": 1, "MemoryMiB": 256}),
            image_json=json.dumps({"TemplateName": prepared.prepared_image_id}),
        )
    )
    assert not _settled(served, created.task).error
    served.Delete(pb.DeleteRequest(id=created.id))
    _destroy_named(simulator, "vs-grpc-ova")


def _destroy_named(simulator: Simulator, name: str) -> None:
    """Remove a template the test imported, so the shared simulator holds only what it had."""
    session = simulator.session()
    instance = session.call(lambda connection: connection)
    for row in retrieve_all_vms(instance, ("name",)):
        if row["name"] == name:
            WaitForTask(row["_ref"].Destroy_Task())
    session.close()


def test_a_content_library_is_unimplemented(served: pb_grpc.ProviderStub) -> None:
    library = {"contentLibrary": {"library": "lib", "item": "ubuntu"}}
    request = pb.ImagePrepareRequest(
        image_json=json.dumps({"source": {"vsphere": library}}), target_name="vs-grpc-library"
    )
    with pytest.raises(grpc.RpcError) as refused:
        served.ImagePrepare(request)
    assert refused.value.code() is grpc.StatusCode.UNIMPLEMENTED
    assert "contentLibrary" in (refused.value.details() or "")


def test_create_takes_the_managers_six_key_image_with_a_datastore_path(
    served: pb_grpc.ProviderStub, simulator: Simulator
) -> None:
    path = f"[{DATASTORE}] imported-vs-grpc/vs-grpc-migrated.vmdk"
    session = simulator.session()
    instance = session.call(lambda connection: connection)
    write_datastore_file(simulator, instance, path, b"imported disk")
    write_datastore_file(simulator, instance, path.replace(".vmdk", "-flat.vmdk"), b"")
    session.close()
    image = {
        "TemplateName": "",
        "Path": path,
        "URL": "",
        "Format": "vmdk",
        "Checksum": "",
        "ChecksumType": "sha256",
    }
    created = served.Create(
        pb.CreateRequest(
            name="vs-grpc-migrated",
            class_json=json.dumps({"CPU": 1, "MemoryMiB": 256}),
            image_json=json.dumps(image),
        )
    )
    assert not _settled(served, created.task).error
    described = served.Describe(pb.DescribeRequest(id=created.id))
    assert described.exists
    served.Delete(pb.DeleteRequest(id=created.id))
    assert not served.Describe(pb.DescribeRequest(id=created.id)).exists
