"""Random and hostile payloads in every JSON field and name: never UNKNOWN/INTERNAL, no crash."""

from __future__ import annotations

import json
from collections.abc import Iterator

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb

from support.e2e import RunningProvider, start_provider

EXPECTED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=20,
)
go_keys = st.sampled_from(
    [
        "CPU",
        "cpu",
        "MemoryMiB",
        "memory",
        "Firmware",
        "DiskDefaults",
        "SizeGiB",
        "ExtraConfig",
        "PerformanceProfile",
        "Path",
        "URL",
        "TemplateName",
        "Name",
        "NetworkName",
        "MacAddress",
        "StaticIP",
        "DNS",
        "VLAN",
        "PCISlotNumber",
        "Datastore",
        "Class",
        "Disks",
        "source",
        "libvirt",
        "hostname",
        "networks",
        "userData",
        "name",
    ]
)
shaped_objects = st.dictionaries(go_keys, json_values, max_size=6)


def as_text(value: object) -> str:
    return json.dumps(value, allow_nan=True)


payloads = st.one_of(
    shaped_objects.map(as_text),
    json_values.map(as_text),
    st.lists(shaped_objects, max_size=3).map(as_text),
    st.text(max_size=60),
    st.sampled_from(["", "null", "[" * 5000, '{"CPU": 1e400}', '"\\ud800"', '{"a":' * 3000]),
)
names = st.one_of(st.text(max_size=140), st.sampled_from(["", "ok-name", "a" * 129, "\u0000"]))
raw_bytes = st.binary(max_size=64)


@pytest.fixture(scope="module")
def provider() -> Iterator[RunningProvider]:
    running = start_provider()
    yield running
    running.channel.close()
    running.application.stop(0)


def code(call: object, request: object) -> grpc.StatusCode:
    try:
        call(request, timeout=10)  # type: ignore[operator]
    except grpc.RpcError as error:
        return error.code()
    return grpc.StatusCode.OK


fuzz = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@fuzz
@given(
    name=names,
    class_json=payloads,
    image_json=payloads,
    networks_json=payloads,
    disks_json=payloads,
    placement_json=payloads,
    user_data=raw_bytes,
    tags=st.lists(st.text(max_size=20), max_size=3),
)
def test_create_never_answers_unknown_or_internal(
    provider: RunningProvider,
    name: str,
    class_json: str,
    image_json: str,
    networks_json: str,
    disks_json: str,
    placement_json: str,
    user_data: bytes,
    tags: list[str],
) -> None:
    request = pb.CreateRequest(
        name=name,
        class_json=class_json,
        image_json=image_json,
        networks_json=networks_json,
        disks_json=disks_json,
        placement_json=placement_json,
        user_data=user_data,
        meta_data=user_data,
        tags=tags,
    )
    assert code(provider.stub.Create, request) in EXPECTED


@fuzz
@given(
    vm_id=names,
    desired_json=payloads,
    op=st.integers(-3, 9),
    timeout=st.integers(-(2**31), 2**31 - 1),
    version=st.integers(-(2**31), 2**31 - 1),
)
def test_mutations_by_id_never_answer_unknown_or_internal(
    provider: RunningProvider, vm_id: str, desired_json: str, op: int, timeout: int, version: int
) -> None:
    stub = provider.stub
    calls = [
        (stub.Reconfigure, pb.ReconfigureRequest(id=vm_id, desired_json=desired_json)),
        (stub.Power, pb.PowerRequest(id=vm_id, op=op, graceful_timeout_seconds=timeout)),  # type: ignore[arg-type]
        (stub.HardwareUpgrade, pb.HardwareUpgradeRequest(id=vm_id, target_version=version)),
        (stub.Describe, pb.DescribeRequest(id=vm_id)),
        (stub.Delete, pb.DeleteRequest(id=vm_id)),
        (stub.TaskStatus, pb.TaskStatusRequest(task=pb.TaskRef(id=vm_id))),
        (stub.SnapshotCreate, pb.SnapshotCreateRequest(vm_id=vm_id, name_hint=vm_id)),
        (stub.GetDiskInfo, pb.GetDiskInfoRequest(vm_id=vm_id, disk_id=vm_id)),
    ]
    for call, request in calls:
        assert code(call, request) in EXPECTED, request


@fuzz
@given(
    target=names,
    class_json=payloads,
    placement_json=payloads,
    customize_json=payloads,
    image_json=payloads,
    url=st.text(max_size=60),
    backend=st.text(max_size=8),
    options=payloads,
)
def test_clone_image_and_disk_payloads_never_answer_unknown_or_internal(
    provider: RunningProvider,
    target: str,
    class_json: str,
    placement_json: str,
    customize_json: str,
    image_json: str,
    url: str,
    backend: str,
    options: str,
) -> None:
    source = provider.stub.ListVMs(pb.ListVMsRequest(), timeout=10).vms
    source_id = source[0].id if source else "none"
    stub = provider.stub
    calls = [
        (
            stub.Clone,
            pb.CloneRequest(
                source_vm_id=source_id,
                target_name=target,
                class_json=class_json,
                placement_json=placement_json,
                customize_json=customize_json,
            ),
        ),
        (stub.ImagePrepare, pb.ImagePrepareRequest(image_json=image_json, target_name=target)),
        (
            stub.ExportDisk,
            pb.ExportDiskRequest(
                vm_id=source_id,
                destination_url=url,
                backend_type=backend,
                format=backend,
                storage_options_json=options,
            ),
        ),
        (
            stub.ImportDisk,
            pb.ImportDiskRequest(
                source_url=url,
                backend_type=backend,
                target_name=target,
                storage_options_json=options,
            ),
        ),
    ]
    for call, request in calls:
        assert code(call, request) in EXPECTED, request
    assert provider.stub.Validate(pb.ValidateRequest(), timeout=10).ok
