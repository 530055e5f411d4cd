"""VMLifecycle on vSphere: VMs made as clones of a template (or around a disk the manager
imported: disk_vm), changed by reconfigure Tasks.

Create, Reconfigure and the hardware upgrade start their vSphere Task and hand back a
`vsphere-task:` id at once, which the TaskTracker answers from vCenter alone (any replica,
after a restart). Delete waits on its Tasks within the call, bounded.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from operator import methodcaller
from typing import Any

from pyVmomi import vim as untyped_vim
from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.vsphere.calls import run
from pyrigaud.adapters.hypervisors.vsphere.class_spec import (
    class_config,
    class_devices,
    hardware_version,
)
from pyrigaud.adapters.hypervisors.vsphere.clone_maker import CloneMaker, CloneOrder
from pyrigaud.adapters.hypervisors.vsphere.customization import guest_customization
from pyrigaud.adapters.hypervisors.vsphere.devices import disk_growth, new_disks
from pyrigaud.adapters.hypervisors.vsphere.disk_vm import DiskVMMaker, destroy_keeping_foreign_disks
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
from pyrigaud.domain.errors import ProviderError
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

        def find(instance: Any) -> Result[VMRecord | None, ProviderError]:
            return Success(self._vcenter.record(instance, name))

        return run(self._vcenter.session, f"finding VM {name!r}", find)

    def find_unfinished(self) -> Result[list[VMRecord], ProviderError]:
        """One listing of every VM's extraConfig: the simulator cannot select one key of it
        (`config.extraConfig["key"]`), and this runs at start-up and periodically only."""

        def read(instance: Any) -> Result[list[VMRecord], ProviderError]:
            rows = retrieve_all_vms(instance, RECORD_PROPERTIES)
            records = [vm_record(row) for row in rows]
            return Success([record for record in records if record.building_since is not None])

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
                    mentions=(fields.IMAGE_TEMPLATE_NAME,),
                )
            )
        if image.path and not image.template_name and not image.url:
            return run(
                self._vcenter.session,
                f"creating VM {request.name!r}",
                partial(self._disk_vms.create, request=request, owner=owner),
            )
        if not image.template_name or image.path or image.url:
            return Failure(
                ProviderError.invalid_spec(
                    fields.IMAGE_TEMPLATE_NAME,
                    "vSphere creates VMs from a template or VM name, or around a datastore disk "
                    "(Path)",
                )
            )

        def configure(instance: Any, devices: list[Any]) -> Result[Any, ProviderError]:
            growth = VMChanges(root_disk_gib=request.vm_class.disk_defaults.size_gib or None)
            api_version = instance.content.about.apiVersion

            def filled(spec: Any, changes: list[Any]) -> Any:
                spec.deviceChange = changes
                return spec

            return Result.do(
                filled(spec, grown + added + nics + tpm)
                for spec in class_config(
                    request.vm_class,
                    {OWNER_KEY: owner.provider},
                    request.user_data,
                    request.meta_data,
                )
                for grown in disk_growth(devices, growth)
                for added in new_disks(devices, request.disks)
                for nics in nic_changes(instance, devices, request.networks, CREATE_ATTACHMENTS)
                for tpm in class_devices(request.vm_class, devices, api_version)
            )

        def make(instance: Any) -> Result[CreatedVM, ProviderError]:
            source = self._vcenter.vm_named(instance, image.template_name)
            if source is None:
                return Failure(
                    ProviderError.invalid_spec(
                        fields.IMAGE_TEMPLATE_NAME,
                        f"no template or VM named {image.template_name!r}",
                    )
                )
            order = Result.do(
                CloneOrder(
                    source=source,
                    name=request.name,
                    owner=owner,
                    placement=request.placement,
                    configure=partial(configure, instance),
                    version=version,
                    guest=guest,
                )
                for version in hardware_version(request.vm_class)
                for guest in guest_customization(
                    request.networks,
                    host_name="",
                    domain="",
                    time_zone="",
                    named=CREATE_ATTACHMENTS,
                )
            )
            return order.bind(partial(self._clone_maker.clone, instance))

        return run(self._vcenter.session, f"creating VM {request.name!r}", make)

    def delete(self, vm_id: str) -> Result[None, ProviderError]:
        def powered_off(instance: Any, vm: Any, state: PowerState) -> Result[Any, ProviderError]:
            if state is PowerState.ON:
                return wait(instance, vm.PowerOffVM_Task())
            return Success(None)

        def removed(instance: Any, vm: Any) -> Result[None, ProviderError]:
            def destroyed(_off: object) -> Result[None, ProviderError]:
                return destroy_keeping_foreign_disks(instance, self._vcenter, vm)

            return (
                self._vcenter.power(instance, vm)
                .bind(partial(powered_off, instance, vm))
                .bind(destroyed)
            )

        def remove(instance: Any) -> Result[None, ProviderError]:
            return self._vcenter.vm(instance, vm_id).bind(partial(removed, instance))

        return run(self._vcenter.session, f"deleting VM {vm_id!r}", remove)

    def reconfigure(self, vm_id: str, changes: VMChanges) -> Result[TaskRef | None, ProviderError]:
        def reconfigured(row: dict[str, Any], growth: list[Any]) -> Any:
            spec = vim.vm.ConfigSpec(
                numCPUs=changes.cpu, memoryMB=changes.memory_mib, deviceChange=growth
            )
            return row["_ref"].ReconfigVM_Task(spec)

        def start(instance: Any) -> Result[Any, ProviderError]:
            return Result.do(
                reconfigured(row, growth)
                for row in self._vcenter.found_row(instance, vm_id, RECONFIGURE_PROPERTIES)
                for _ in _refuse_offline_only_changes(row, changes)
                for growth in disk_growth(list(row.get("config.hardware.device") or ()), changes)
            )

        operation = TaskOperation(f"reconfiguring VM {vm_id!r}", vm_id, start)
        return begin(self._vcenter.session, operation)

    def upgrade_hardware(
        self, vm_id: str, target_version: int
    ) -> Result[TaskRef | None, ProviderError]:
        version = f"vmx-{target_version:02d}" if target_version else None

        def start(instance: Any) -> Result[Any, ProviderError]:
            return self._vcenter.vm(instance, vm_id).map(methodcaller("UpgradeVM_Task", version))

        operation = TaskOperation(f"upgrading VM {vm_id!r}", vm_id, start)
        return begin(self._vcenter.session, operation)


def _refuse_offline_only_changes(
    row: Mapping[str, Any], changes: VMChanges
) -> Result[None, ProviderError]:
    """A running VM takes CPU and memory changes only with hot-add enabled, and never shrinks."""
    if power_state(row) is PowerState.OFF:
        return Success(None)
    cpu_now = int(row.get("config.hardware.numCPU") or 0)
    memory_now = int(row.get("config.hardware.memoryMB") or 0)
    problem = ""
    if changes.cpu is not None and changes.cpu != cpu_now:
        if not row.get("config.cpuHotAddEnabled"):
            problem = "CPU hot-add disabled; power off to change CPUs"
        elif changes.cpu < cpu_now:
            problem = "CPUs cannot shrink while the VM runs"
    if not problem and changes.memory_mib is not None and changes.memory_mib != memory_now:
        if not row.get("config.memoryHotAddEnabled"):
            problem = "memory hot-add disabled; power off to change memory"
        elif changes.memory_mib < memory_now:
            problem = "memory cannot shrink while the VM runs"
    return Failure(ProviderError.failed_precondition(problem)) if problem else Success(None)
