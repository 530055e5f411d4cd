"""ListVMs of a few thousand simulated VMs through gRPC: every VM, right fields, and an answer
small enough that 10,000 such VMs still fit the manager's 4 MiB default message limit."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pyrigaud.adapters.hypervisors.vsphere.vcenter import INSTANCE_UUID
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb

from support.e2e import RunningProvider, start_provider
from support.vsphere import running_simulator

VMS_PER_POOL = 1000  # the default inventory has two pools: standalone host DC0_H0, cluster DC0_C0
MANAGER_MESSAGE_LIMIT = 4 * 1024 * 1024  # grpc-go's default receive limit, which the manager keeps
TARGET_VMS = 10_000
BYTES_PER_VM_BUDGET = 400  # x 10,000 = 4.0 MB, under 4 MiB with room for the envelope


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProvider]:
    """pyrigaud on a simulator of 2,000 VMs; its client keeps gRPC's 4 MiB receive default."""
    credentials = tmp_path_factory.mktemp("credentials")
    with running_simulator("-vm", str(VMS_PER_POOL)) as simulator:
        (credentials / "username").write_text(simulator.username)
        (credentials / "password").write_text(simulator.password)
        running = start_provider(
            {
                "PROVIDER_TYPE": "vsphere",
                "PROVIDER_ENDPOINT": simulator.endpoint,
                "TLS_INSECURE_SKIP_VERIFY": "true",
                "PYRIGAUD_CREDENTIALS_DIR": str(credentials),
            }
        )
        yield running
        running.channel.close()
        running.application.stop(0)


@pytest.fixture(scope="module")
def listing(provider: RunningProvider) -> pb.ListVMsResponse:
    return provider.stub.ListVMs(pb.ListVMsRequest(), timeout=60)


def test_every_simulated_vm_is_listed_once(listing: pb.ListVMsResponse) -> None:
    expected = {f"DC0_H0_VM{i}" for i in range(VMS_PER_POOL)}
    expected |= {f"DC0_C0_RP0_VM{i}" for i in range(VMS_PER_POOL)}
    assert sorted(vm.name for vm in listing.vms) == sorted(expected)
    assert len({vm.id for vm in listing.vms}) == len(expected)


def test_each_listed_vm_carries_the_simulators_hardware(listing: pb.ListVMsResponse) -> None:
    for vm in listing.vms:
        assert INSTANCE_UUID.fullmatch(vm.id), vm
        assert (vm.power_state, vm.cpu, vm.memory_mib) == ("On", 1, 32), vm
        assert [(d.path, d.format) for d in vm.disks] == [
            (f"[LocalDS_0] {vm.name}/disk1.vmdk", "vmdk")
        ], vm
        assert len(vm.networks) == 1, vm
        assert vm.networks[0].mac.count(":") == 5, vm


def test_the_answer_extrapolates_under_the_managers_limit(listing: pb.ListVMsResponse) -> None:
    per_vm = listing.ByteSize() / len(listing.vms)
    assert per_vm <= BYTES_PER_VM_BUDGET, f"{per_vm:.0f} bytes per VM"
    assert per_vm * TARGET_VMS < MANAGER_MESSAGE_LIMIT


def test_a_listed_vm_describes_as_listed(
    provider: RunningProvider, listing: pb.ListVMsResponse
) -> None:
    vm = listing.vms[len(listing.vms) // 2]
    described = provider.stub.Describe(pb.DescribeRequest(id=vm.id), timeout=20)
    assert (described.exists, described.power_state) == (True, vm.power_state)
