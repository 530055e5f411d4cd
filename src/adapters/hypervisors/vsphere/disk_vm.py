"""Create around an existing disk: the manager's VM made from a disk it imported (the image's
`Path`, "[datastore] dir/name.vmdk"), instead of a clone of a template.

CreateVM_Task makes the VM whole or not at all, with the class, cloud-init guestinfo, NICs,
extra disks and ownership mark in its one config spec, the disk attached as it is (persistent)
and the VM's home on the disk's datastore. The disk's controller and the NICs' models are the
guest's own, or their nearest equivalent (`device_models.py`), when its import's record tells
them (`CreateRequest.hardware`); else the disk is on a new LSI Logic controller, as upstream's
provider does. A guest customization (static IPs, time zone) or a class root-disk size larger
than the disk (grown, never shrunk) needs more tasks: that VM is made with the building mark,
grown and customized, then unmarked, and a failure on the way destroys it again with the
imported disk detached first, so a retry finds the disk where it was.

Once the VM is complete, the disk is the VM's own: Delete destroys the VM and vCenter deletes
its disks with it, the imported one included. A VM still marked as building has not taken the
disk yet: deleting it (the crash sweep does) detaches disks outside its home directory first.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Mapping
from functools import partial
from typing import Any

from pyVmomi import vim as untyped_vim
from returns.converters import flatten
from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.cleanup import undone_on_failure
from pyrigaud.adapters.hypervisors.vsphere import datastore_files
from pyrigaud.adapters.hypervisors.vsphere.calls import best_effort
from pyrigaud.adapters.hypervisors.vsphere.class_spec import (
    class_config,
    class_devices,
    hardware_version,
)
from pyrigaud.adapters.hypervisors.vsphere.customization import (
    GuestCustomization,
    guest_customization,
)
from pyrigaud.adapters.hypervisors.vsphere.device_models import (
    CONTROLLER_CLASSES,
    FALLBACK_NIC,
    FallbackCounters,
    GuestDevices,
    guest_devices,
)
from pyrigaud.adapters.hypervisors.vsphere.devices import disk_growth, new_disks, nic_count
from pyrigaud.adapters.hypervisors.vsphere.networks import CREATE_ATTACHMENTS, nic_changes
from pyrigaud.adapters.hypervisors.vsphere.placement import (
    Location,
    merged,
    named_entity,
    resolve_on_datastore,
)
from pyrigaud.adapters.hypervisors.vsphere.properties import extra_config
from pyrigaud.adapters.hypervisors.vsphere.tasks import VSphereTask, ended, wait
from pyrigaud.adapters.hypervisors.vsphere.vcenter import VCenter
from pyrigaud.adapters.hypervisors.vsphere.vm_rows import (
    BUILDING_KEY,
    OWNER_KEY,
    building_marks,
)
from pyrigaud.application.ports import Clock
from pyrigaud.application.ports.vm_lifecycle import CreatedVM
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.hardware import DiskController
from pyrigaud.domain.models import (
    CreateRequest,
    NetworkAttachment,
    OwnerMark,
    Placement,
    VMChanges,
)

# pyVmomi's stubs leave its data-object constructors untyped: use them dynamically.
vim: Any = untyped_vim
logger = logging.getLogger(__name__)

DATASTORE_PATH = re.compile(r"\[(?P<datastore>[^\]]+)\] (?P<file>[^\x00-\x1f]+\.vmdk)")
DEFAULT_GUEST_ID = "otherLinux64Guest"
DEFAULT_CONTROLLER = DiskController.LSI_LOGIC  # when nothing is known of the guest's
CONTROLLER_KEY = -400
ROOT_DISK_KEY = -401
EXTRA_CONTROLLER_KEY = -402
IDE_CONTROLLER_KEY = 200  # the first of the two IDE controllers vCenter gives every VM
# The properties delete reads to tell which disks a building VM must leave behind.
DELETE_PROPERTIES = (
    "runtime.powerState",
    "config.extraConfig",
    "config.hardware.device",
    "config.files.vmPathName",
)


class DiskVMMaker:
    def __init__(
        self,
        vcenter: VCenter,
        defaults: Placement,
        clock: Clock,
        fallbacks: FallbackCounters | None = None,
    ) -> None:
        """`defaults` are the PROVIDER_DEFAULT_* placement settings; `clock` dates the
        building mark (the wall clock that every replica shares); `fallbacks` are told of
        each VM given a device its guest had no equivalent of."""
        self._vcenter = vcenter
        self._defaults = defaults
        self._clock = clock
        self._fallbacks = fallbacks or FallbackCounters()

    def create(
        self, instance: Any, request: CreateRequest, owner: OwnerMark
    ) -> Result[CreatedVM, ProviderError]:
        """The VM around the image's disk; ALREADY_EXISTS when a VM of that name exists."""
        found = DATASTORE_PATH.fullmatch(request.image.path)
        if found is None:
            return Failure(
                ProviderError.invalid_spec(
                    fields.IMAGE_PATH, "must name a datastore disk: '[datastore] dir/name.vmdk'"
                )
            )
        if self._vcenter.vm_named(instance, request.name) is not None:
            return Failure(
                ProviderError.already_exists(f"a VM named {request.name!r} already exists")
            )
        datastore_name = found["datastore"]
        placement = merged(request.placement, self._defaults)
        root_gib = request.vm_class.disk_defaults.size_gib or None
        chosen = None if request.hardware is None else guest_devices(request.hardware)
        made = Result.do(
            self._made(instance, location, guest, root_gib, spec)
            for datastore in named_entity(
                instance, vim.Datastore, datastore_name, fields.IMAGE_PATH
            )
            for location in resolve_on_datastore(instance, placement, datastore)
            for guest in guest_customization(
                request.networks, host_name="", domain="", time_zone="", named=CREATE_ATTACHMENTS
            )
            for spec in self._config(
                instance,
                request,
                self._marks(owner, in_steps=guest is not None or root_gib is not None),
                datastore_name,
                chosen,
            )
        )
        return flatten(made).map(partial(self._told, request, chosen))

    def _marks(self, owner: OwnerMark, *, in_steps: bool) -> dict[str, str]:
        """A VM made in steps is marked as building until the last one."""
        if in_steps:
            return building_marks(owner.provider, self._clock.now())
        return {OWNER_KEY: owner.provider}

    def _made(
        self,
        instance: Any,
        location: Location,
        guest: GuestCustomization | None,
        root_gib: int | None,
        spec: Any,
    ) -> Result[CreatedVM, ProviderError]:
        task = location.folder.CreateVM_Task(config=spec, pool=location.pool, host=location.host)
        if guest is None and root_gib is None:
            started = VSphereTask(task=str(task._moId), vm_id=spec.instanceUuid)
            return Success(CreatedVM(id=spec.instanceUuid, task=started.task_ref()))

        def created(_finished: None) -> CreatedVM:
            return CreatedVM(id=spec.instanceUuid)

        finished = partial(self._finished, instance, guest=guest, root_gib=root_gib, spec=spec)
        return wait(instance, task).bind(finished).map(created)

    def _finished(
        self,
        instance: Any,
        vm: Any,
        guest: GuestCustomization | None,
        root_gib: int | None,
        spec: Any,
    ) -> Result[None, ProviderError]:
        """The root disk grown and the guest customized, then the building mark cleared; a
        failure leaves no half-built VM behind, and the imported disk where it was."""

        def finished() -> Result[None, ProviderError]:
            grown = (
                Success(None) if root_gib is None else self._grow_root_disk(instance, vm, root_gib)
            )

            def customized(_grown: None) -> Result[None, ProviderError]:
                return self._customized(instance, vm, guest, spec)

            def unmarked(_customized: None) -> Result[None, ProviderError]:
                return self._vcenter.set_extra_config(instance, vm, {BUILDING_KEY: ""})

            return grown.bind(customized).bind(unmarked)

        return undone_on_failure(finished, partial(self._forget, instance, vm))

    def _forget(self, instance: Any, vm: Any) -> None:
        """The caller's failure is the one told (so this cleanup's own is not)."""
        best_effort(partial(destroy_keeping_foreign_disks, instance, self._vcenter, vm))

    @staticmethod
    def _customized(
        instance: Any, vm: Any, guest: GuestCustomization | None, spec: Any
    ) -> Result[None, ProviderError]:
        if guest is None:
            return Success(None)
        nics = nic_count([], spec.deviceChange)
        return ended(instance, vm.CustomizeVM_Task(guest.spec(nics)))

    def _grow_root_disk(self, instance: Any, vm: Any, size_gib: int) -> Result[None, ProviderError]:
        """The class's root-disk size, when the attached disk is smaller (it never shrinks)."""
        devices = self._vcenter.devices(instance, vm)
        disks = [d for d in devices if isinstance(d, vim.vm.device.VirtualDisk)]
        if not disks or disks[0].capacityInKB >= size_gib * 1024 * 1024:
            return Success(None)

        def grown(edits: list[Any]) -> Result[None, ProviderError]:
            return ended(instance, vm.ReconfigVM_Task(vim.vm.ConfigSpec(deviceChange=edits)))

        return disk_growth(devices, VMChanges(root_disk_gib=size_gib)).bind(grown)

    def _config(
        self,
        instance: Any,
        request: CreateRequest,
        marks: Mapping[str, str],
        datastore_name: str,
        chosen: GuestDevices | None,
    ) -> Result[Any, ProviderError]:
        boot = boot_devices(
            request.image.path,
            DEFAULT_CONTROLLER if chosen is None else chosen.controller,
            extra_disks=bool(request.disks),
        )
        networks = request.networks if chosen is None else with_models(request.networks, chosen)
        api_version = instance.content.about.apiVersion

        def filled(spec: Any, version: str | None, changes: list[Any]) -> Any:
            spec.name = request.name
            spec.guestId = DEFAULT_GUEST_ID
            spec.instanceUuid = str(uuid.uuid4())
            spec.version = version
            spec.files = vim.vm.FileInfo(vmPathName=f"[{datastore_name}]")
            spec.deviceChange = [
                *(vim.vm.device.VirtualDeviceSpec(operation="add", device=d) for d in boot),
                *changes,
            ]
            return spec

        return Result.do(
            filled(spec, version, added + nics + tpm)
            for spec in class_config(request.vm_class, marks, request.user_data, request.meta_data)
            for version in hardware_version(request.vm_class)
            for added in new_disks(boot, request.disks)
            for nics in nic_changes(instance, boot, networks, CREATE_ATTACHMENTS)
            for tpm in class_devices(request.vm_class, boot, api_version)
        )

    def _told(
        self, request: CreateRequest, chosen: GuestDevices | None, created: CreatedVM
    ) -> CreatedVM:
        """The VM, once its Create has begun; a device its guest had no equivalent of on
        vSphere is said in a warning and counted."""
        if chosen is None:
            return created
        name = request.name
        if chosen.controller_fallback:
            logger.warning(
                "VM %r: its guest's disk was on %s, which vSphere does not offer; it is on "
                "the %s controller instead (see the docs' migration page)",
                name,
                chosen.controller_fallback,
                chosen.controller,
            )
            self._fallbacks.disk_controller()
        nic_fallbacks = chosen.nic_fallbacks(request.networks)
        if nic_fallbacks:
            logger.warning(
                "VM %r: its guest's NICs %s have no vSphere equivalent; they are %s instead",
                name,
                ", ".join(nic_fallbacks),
                FALLBACK_NIC,
            )
            self._fallbacks.nic()
        return created


def boot_devices(path: str, controller: DiskController, *, extra_disks: bool) -> list[Any]:
    """The disk at `path` attached as it is (persistent) on a new controller of the kind
    given (IDE: the VM's own first IDE controller, which every VM has), and a new LSI Logic
    controller for the extra disks when that one is no SCSI controller."""
    devices: list[Any] = []
    controller_key = IDE_CONTROLLER_KEY
    if controller is not DiskController.IDE:
        devices.append(_new_controller(CONTROLLER_CLASSES[controller], CONTROLLER_KEY))
        controller_key = CONTROLLER_KEY
    devices.append(
        vim.vm.device.VirtualDisk(
            key=ROOT_DISK_KEY,
            controllerKey=controller_key,
            unitNumber=0,
            capacityInKB=0,  # an existing disk keeps its own size
            backing=vim.vm.device.VirtualDisk.FlatVer2BackingInfo(
                fileName=path, diskMode="persistent"
            ),
        )
    )
    scsi = any(isinstance(d, vim.vm.device.VirtualSCSIController) for d in devices)
    if extra_disks and not scsi:
        devices.append(
            _new_controller(vim.vm.device.VirtualLsiLogicController, EXTRA_CONTROLLER_KEY)
        )
    return devices


def _new_controller(kind: Any, key: int) -> Any:
    controller = kind(key=key, busNumber=0)
    if isinstance(controller, vim.vm.device.VirtualSCSIController):
        controller.sharedBus = "noSharing"
    return controller


def with_models(
    networks: tuple[NetworkAttachment, ...], chosen: GuestDevices
) -> tuple[NetworkAttachment, ...]:
    """Each attachment with the model of the guest's NIC at its place, unless it names one."""
    models = [chosen.nic_model(index) for index in range(len(networks))]
    return tuple(
        attachment
        if attachment.model or model is None
        else attachment.model_copy(update={"model": str(model)})
        for attachment, model in zip(networks, models, strict=True)
    )


def destroy_keeping_foreign_disks(
    instance: Any, vcenter: VCenter, vm: Any
) -> Result[None, ProviderError]:
    """Destroy the VM; while it is still marked as building, detach first the disks outside
    its home directory (a disk it was built around), which Destroy_Task would delete."""
    row = vcenter.vm_row(instance, vm._moId, DELETE_PROPERTIES)
    if row is None:
        return Success(None)
    removals = foreign_disk_removals(row)
    detached = (
        wait(instance, vm.ReconfigVM_Task(vim.vm.ConfigSpec(deviceChange=removals)))
        if removals
        else Success(None)
    )

    def destroyed_now(_detached: object) -> Result[None, ProviderError]:
        return ended(instance, vm.Destroy_Task())

    return detached.bind(destroyed_now)


def foreign_disk_removals(row: Mapping[str, Any]) -> list[Any]:
    """Device specs detaching (not deleting) the disks of a still-building VM that live outside
    its home directory; none for a complete VM, whose disks are its own."""
    if BUILDING_KEY not in {k for k, v in extra_config(row).items() if v}:
        return []
    home = datastore_files.folder_of(str(row.get("config.files.vmPathName") or "")) + "/"
    return [
        vim.vm.device.VirtualDeviceSpec(operation="remove", device=device)
        for device in row.get("config.hardware.device") or ()
        if isinstance(device, vim.vm.device.VirtualDisk)
        and not str(getattr(device.backing, "fileName", "")).startswith(home)
    ]
