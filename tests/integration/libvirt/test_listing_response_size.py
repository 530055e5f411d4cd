"""ListVMs' answer on libvirt stays small enough that 10,000 VMs fit the manager's 4 MiB default
gRPC message limit: measured on VMs made the way the manager makes them (a root disk, an extra
disk, a NIC), encoded exactly as the servicer sends them."""

from __future__ import annotations

from pathlib import Path

from pyrigaud.domain.models import CreateRequest, DiskSpec, OwnerMark, VMClass
from pyrigaud.entrypoints.grpc import translate
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb

from support import ManualClock, ok
from support.libvirt import create_vm, make_backend, node_xml

OWNER = OwnerMark(provider="tests/libvirt-listing-size")
VMS = 200
# The test driver's volumes are not files, so its pool may sit where a real host's does: disk
# paths as long as production ones.
PRODUCTION_POOL = Path("/var/lib/libvirt/images")
MANAGER_MESSAGE_LIMIT = 4 * 1024 * 1024  # grpc-go's default receive limit, which the manager keeps
TARGET_VMS = 10_000


def test_ten_thousand_listed_vms_would_fit_the_managers_message_limit(tmp_path: Path) -> None:
    node = tmp_path / "node.xml"
    node.write_text(node_xml(PRODUCTION_POOL))
    backend, connection = make_backend(f"test://{node}", ManualClock())
    try:
        for index in range(VMS):
            request = CreateRequest(
                name=f"tenant-a-web-frontend-{index:05d}",  # a manager-style namespaced name
                vm_class=VMClass(cpu=2, memory_mib=2048),
                disks=(DiskSpec(size_gib=10),),
            )
            ok(create_vm(backend, request, OWNER))
        listed = ok(backend.inventory.list_vms())
        assert len(listed) == VMS
        answer = pb.ListVMsResponse(vms=[translate.vm_info(vm) for vm in listed])
        per_vm = answer.ByteSize() / VMS
        assert per_vm * TARGET_VMS < MANAGER_MESSAGE_LIMIT, f"{per_vm:.0f} B per VM"
        assert all(len(vm.disks) == 2 and len(vm.networks) == 1 for vm in answer.vms)
    finally:
        connection.close()
