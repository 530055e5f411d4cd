"""VMLifecycle on vSphere: VMs made as clones of a template (or around a disk the manager
imported: disk_vm), changed by reconfigure Tasks.

Create, Reconfigure and the hardware upgrade start their vSphere Task and hand back a
`vsphere-task:` id at once, which the TaskTracker answers from vCenter alone (any replica,
after a restart). Delete waits on its Tasks within the call, bounded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyVmomi import vim as untyped_vim
from returns.result import Failure, Result

from pyrigaud.adapters.hypervisors.vsphere.class_spec import (
    class_config,
    class_devices,
    hardware_version,
)
from pyrigaud.adapters.hypervisors.vsphere.clone_maker import CloneMaker, CloneOrder
from pyrigaud.adapters.hypervisors.vsphere.customization import guest_customization
from pyrigaud.adapters.hypervisors.vsphere.devices import disk_growth, new_disks
from pyrigaud.adapters.hypervisors.vsphere.disk_vm import DiskVMMaker, destroy_keeping_foreign_disks
from pyrigaud.adapters.hypervisors.vsphere.errors import run
from pyrigaud.adapters.hypervisors.vsphere.networks import CREATE_ATTACHMENTS, nic_changes
from pyrigaud.adapters.hypervisors.vsphere.properties import retrieve_all_vms
from pyrigaud.adapters.hypervisors.vsphere.tasks import TaskOperation, begin, wait
from pyrigaud.adapters.hypervisors.vsphere.vcenter import VCenter
from pyrigaud.adapters.hypervisors.vsphere.vm_rows import (
    OWNER_KEY,
    RECORD_PROPERTIES,
    power_state,
    vm_record,
)
from pyrigaud.application.ports.vm_lifecycle import CreatedVM
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ExpectedError, ProviderError
from pyrigaud.domain.models import CreateRequest, OwnerMark, VMChanges, VMRecord
from pyrigaud.domain.power import PowerState
from pyrigaud.domain.tasks import TaskRef

# pyVmomi's stubs leave its data-object constructors untyped: use them dynamically.
vim: Any = untyped_vim

RECONFIGURE_PROPERTIES = (
    "runtime.powerState",
    "config.hardware.numCPU",
    "config.hardware.memoryMB",
    "config.hardware.device",
    "config.cpuHotAddEnabled",
    "config.memoryHotAddEnabled",
)


class VSphereVMLifecycle:
    def __init__(self, vcenter: VCenter, clone_maker: CloneMaker, disk_vms: DiskVMMaker) -> None:
        self._vcenter = vcenter
        self._clone_maker = clone_maker
        self._disk_vms = disk_vms

    def find_by_name(self, name: str) -> Result[VMRecord | None, ProviderError]:
        return run(
            self._vcenter.session,
            f"finding VM {name!r}",
            lambda instance: self._vcenter.record(instance, name),
        )

    def find_unfinished(self) -> Result[list[VMRecord], ProviderError]:
        """One listing of every VM's extraConfig: the simulator cannot select one key of it
        (`config.extraConfig["key"]`), and this runs at start-up and periodically only."""

        def read(instance: Any) -> list[VMRecord]:
            rows = retrieve_all_vms(instance, RECORD_PROPERTIES)
            records = [vm_record(row) for row in rows]
            return [record for record in records if record.building_since is not None]

        return run(self._vcenter.session, "finding unfinished VMs", read)

    def start_create(
        self, request: CreateRequest, owner: OwnerMark
    ) -> Result[CreatedVM, ProviderError]:
        """A clone of the template named in the image (or a VM around the datastore disk its
        Path names), with the class, disks and networks in the clone spec; ALREADY_EXISTS when
        a VM of that name exists, whoever made it."""
        image = request.image
        if image.is_blank:
            return Failure(
                ProviderError.invalid_spec(
                    fields.IMAGE,
                    f"vSphere cannot make a blank root disk; set {fields.IMAGE_TEMPLATE_NAME}",
                )
            )
        if image.path and not image.template_name and not image.url:
            return run(
                self._vcenter.session,
                f"creating VM {request.name!r}",
                lambda instance: self._disk_vms.create(instance, request, owner),
            )
        if not image.template_name or image.path or image.url:
            return Failure(
                ProviderError.invalid_spec(
                    fields.IMAGE_TEMPLATE_NAME,
                    "vSphere creates VMs from a template or VM name, or around a datastore disk "
                    "(Path)",
                )
            )

        def make(instance: Any) -> CreatedVM:
            source = self._vcenter.vm_named(instance, image.template_name)
            if source is None:
                raise ExpectedError(
                    ProviderError.invalid_spec(
                        fields.IMAGE_TEMPLATE_NAME,
                        f"no template or VM named {image.template_name!r}",
                    )
                )
            version = hardware_version(request.vm_class)
            guest = guest_customization(
                request.networks, host_name="", domain="", time_zone="", named=CREATE_ATTACHMENTS
            )

            def configure(devices: list[Any]) -> Any:
                spec = class_config(
                    request.vm_class,
                    {OWNER_KEY: owner.provider},
                    request.user_data,
                    request.meta_data,
                )
                growth = VMChanges(root_disk_gib=request.vm_class.disk_defaults.size_gib or None)
                spec.deviceChange = (
                    disk_growth(devices, growth)
                    + new_disks(devices, request.disks)
                    + nic_changes(instance, devices, request.networks, CREATE_ATTACHMENTS)
                    + class_devices(request.vm_class, devices, instance.content.about.apiVersion)
                )
                return spec

            order = CloneOrder(
                source=source,
                name=request.name,
                owner=owner,
                placement=request.placement,
                configure=configure,
                version=version,
                guest=guest,
            )
            return self._clone_maker.clone(instance, order)

        return run(self._vcenter.session, f"creating VM {request.name!r}", make)

    def delete(self, vm_id: str) -> Result[None, ProviderError]:
        def remove(instance: Any) -> None:
            vm = self._vcenter.vm(instance, vm_id)
            if self._vcenter.power(instance, vm) is PowerState.ON:
                wait(instance, vm.PowerOffVM_Task())
            destroy_keeping_foreign_disks(instance, self._vcenter, vm)

        return run(self._vcenter.session, f"deleting VM {vm_id!r}", remove)

    def reconfigure(self, vm_id: str, changes: VMChanges) -> Result[TaskRef | None, ProviderError]:
        def start(instance: Any) -> Any:
            row = self._vcenter.vm_row(instance, vm_id, RECONFIGURE_PROPERTIES)
            if row is None:
                raise ExpectedError(ProviderError.vm_not_found(vm_id))
            _refuse_offline_only_changes(row, changes)
            spec = vim.vm.ConfigSpec(
                numCPUs=changes.cpu,
                memoryMB=changes.memory_mib,
                deviceChange=disk_growth(list(row.get("config.hardware.device") or ()), changes),
            )
            return row["_ref"].ReconfigVM_Task(spec)

        operation = TaskOperation(f"reconfiguring VM {vm_id!r}", vm_id, start)
        return begin(self._vcenter.session, operation)

    def upgrade_hardware(
        self, vm_id: str, target_version: int
    ) -> Result[TaskRef | None, ProviderError]:
        version = f"vmx-{target_version:02d}" if target_version else None
        operation = TaskOperation(
            f"upgrading VM {vm_id!r}",
            vm_id,
            lambda instance: self._vcenter.vm(instance, vm_id).UpgradeVM_Task(version),
        )
        return begin(self._vcenter.session, operation)


def _refuse_offline_only_changes(row: Mapping[str, Any], changes: VMChanges) -> None:
    """A running VM takes CPU and memory changes only with hot-add enabled, and never shrinks."""
    if power_state(row) is PowerState.OFF:
        return
    cpu_now = int(row.get("config.hardware.numCPU") or 0)
    memory_now = int(row.get("config.hardware.memoryMB") or 0)
    if changes.cpu is not None and changes.cpu != cpu_now:
        if not row.get("config.cpuHotAddEnabled"):
            raise ExpectedError(
                ProviderError.failed_precondition("CPU hot-add disabled; power off to change CPUs")
            )
        if changes.cpu < cpu_now:
            raise ExpectedError(
                ProviderError.failed_precondition("CPUs cannot shrink while the VM runs")
            )
    if changes.memory_mib is not None and changes.memory_mib != memory_now:
        if not row.get("config.memoryHotAddEnabled"):
            raise ExpectedError(
                ProviderError.failed_precondition(
                    "memory hot-add disabled; power off to change memory"
                )
            )
        if changes.memory_mib < memory_now:
            raise ExpectedError(
                ProviderError.failed_precondition("memory cannot shrink while the VM runs")
            )
