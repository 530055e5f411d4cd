"""The vSphere adapter: every port, over one shared session; faults become ProviderErrors."""

from __future__ import annotations

import contextlib
import json
import math
import re
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pyVmomi import vim as untyped_vim
from returns.result import Failure, Result, Success

from pyrigaud.adapters.clocks import SystemClock
from pyrigaud.adapters.hypervisors.vsphere.class_spec import (
    class_config,
    class_devices,
    guestinfo,
    hardware_version,
)
from pyrigaud.adapters.hypervisors.vsphere.customization import (
    GuestCustomization,
    guest_customization,
)
from pyrigaud.adapters.hypervisors.vsphere.errors import (
    EXPECTED_FAILURES,
    AdapterError,
    is_missing,
    provider_error,
)
from pyrigaud.adapters.hypervisors.vsphere.inventory import (
    VM_PROPERTIES,
    extra_config,
    retrieve,
    retrieve_all_vms,
)
from pyrigaud.adapters.hypervisors.vsphere.networks import nic_changes
from pyrigaud.adapters.hypervisors.vsphere.placement import merged, resolve
from pyrigaud.adapters.hypervisors.vsphere.session import (
    VSphereSession,
    credentials_from,
)
from pyrigaud.adapters.hypervisors.vsphere.tasks import VSphereTask, progress
from pyrigaud.application.ports import Clock, Credentials
from pyrigaud.application.ports.vm_lifecycle import CreatedVM
from pyrigaud.domain.addresses import routable_addresses
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import (
    Capabilities,
    CloneRequest,
    CreateRequest,
    Customization,
    DiskDetails,
    DiskInfo,
    DiskQuery,
    DiskSpec,
    ExportRequest,
    ExportResult,
    HealthReport,
    ImportRequest,
    ImportResult,
    NetworkInfo,
    OwnerMark,
    Placement,
    PreparedImage,
    PrepareImageRequest,
    Snapshot,
    SnapshotRequest,
    VMChanges,
    VMDescription,
    VMInfo,
    VMRecord,
)
from pyrigaud.domain.power import PowerState
from pyrigaud.domain.tasks import TaskRef, TaskState

# pyVmomi's stubs leave its data-object constructors untyped: use them dynamically.
vim: Any = untyped_vim

T = TypeVar("T")

OWNER_KEY = "pyrigaud.owner"
# Unix time a Create (or Clone) made in several steps began; removed once the VM is complete.
BUILDING_KEY = "pyrigaud.building"
SHUTDOWN_DEADLINE_KEY = "pyrigaud.shutdownDeadline"
TASK_DEADLINE_SECONDS = 240.0
# MoRef values are short ASCII words (vm-42, or 42 on a bare ESXi host); anything else names
# nothing and is answered as missing without a round trip.
MOREF_VALUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,79}")
# What Create and Clone return: the instanceUuid pyrigaud chose for the VM in its clone spec.
INSTANCE_UUID = re.compile(r"[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")
GIB = 1024**3
DISK_PROVISIONING = {
    "thin": (True, False),
    "thick": (False, False),
    "eagerzeroedthick": (False, True),
}
RECORD_PROPERTIES = ("name", "config.extraConfig", "config.instanceUuid")
RECONFIGURE_PROPERTIES = (
    "runtime.powerState",
    "config.hardware.numCPU",
    "config.hardware.memoryMB",
    "config.hardware.device",
    "config.cpuHotAddEnabled",
    "config.memoryHotAddEnabled",
)


class VSphereHypervisor:
    """Create, Clone, Reconfigure, hardware upgrade, power and snapshot removal/revert start
    their vSphere Task and hand back a `vsphere-task:` id at once, which `task_state` answers
    from vCenter alone (any replica, after a restart). Delete and SnapshotCreate (whose
    response must carry the snapshot) wait on their Tasks within the call, bounded.

    A VM is named by its instanceUuid: Create and Clone choose it in the clone spec and return
    it at once (the MoRef exists only once the clone task has finished), and ListVMs reports
    it. A MoRef (vm-42: an id stored earlier, or taken from vCenter's tools) names it too."""

    def __init__(
        self,
        session: VSphereSession,
        defaults: Placement | None = None,
        clock: Clock | None = None,
    ) -> None:
        """`defaults` are the PROVIDER_DEFAULT_* placement settings; `clock` dates the
        building mark (the wall clock that every replica shares)."""
        self._session = session
        self._defaults = defaults or Placement()
        self._clock = clock or SystemClock()
        # instanceUuid -> MoRef: fixed for a VM's life, so a memo and not replica state.
        self._morefs: dict[str, str] = {}

    # Health and capabilities

    def check(self) -> HealthReport:
        try:
            self._session.call(lambda instance: instance.CurrentTime())
        except EXPECTED_FAILURES as error:
            return HealthReport(ok=False, message=str(provider_error(error, "vCenter")))
        return HealthReport(ok=True, message="vCenter reachable")

    def capabilities(self) -> Capabilities:
        return Capabilities(
            supports_reconfigure_online=True,  # CPU/memory where hot-add is enabled
            supports_disk_expansion_online=True,
            supports_snapshots=True,
            supports_memory_snapshots=True,
            supports_linked_clones=True,
            supports_clone=True,
            supports_hardware_upgrade=True,
            supported_disk_types=tuple(DISK_PROVISIONING),
            supported_network_types=("portgroup", "distributed-portgroup"),
        )

    def task_state(self, task_id: str) -> TaskState | None:
        """A `vsphere-task:` id's state in one round trip; an unreadable one is still running
        with the reason as its error (the caller asks again)."""
        task = VSphereTask.parse(task_id)
        if task is None:
            return None

        def read(instance: Any) -> TaskState:
            found = progress(instance, vim.Task(task.task, instance._stub))
            if found is None:
                return TaskState.failed(
                    f"vSphere task {task.task!r} (VM {task.vm_id!r}) is unknown or expired; "
                    "vCenter keeps finished tasks for a limited time only"
                )
            if found.succeeded:
                return TaskState.succeeded()
            if found.failed:
                return TaskState.failed(_fault_message(found.error))
            return TaskState.running()

        answer = self._run(f"reading vSphere task {task.task!r}", read)
        return answer.lash(lambda error: Success(TaskState(done=False, error=str(error)))).unwrap()

    # Inventory

    def describe(self, vm_id: str) -> Result[VMDescription | None, ProviderError]:
        def read(instance: Any) -> VMDescription | None:
            row = self._vm_row(
                instance, vm_id, ("name", "runtime.powerState", "guest.net", "config.hardware")
            )
            if row is None:
                return None
            hardware = row.get("config.hardware")
            moref = str(row["_ref"]._moId)
            raw = {"name": str(row.get("name", "")), "moref": moref}
            if hardware is not None:
                raw |= {"numCPU": str(hardware.numCPU), "memoryMB": str(hardware.memoryMB)}
            return VMDescription(
                power_state=_power_state(row),
                ips=_ips(row),
                console_url=self._console_url(instance, moref),
                raw=raw,
            )

        return self._run(f"describing VM {vm_id!r}", read)

    def vm_info(self, vm_id: str) -> Result[VMInfo | None, ProviderError]:
        def read(instance: Any) -> VMInfo | None:
            row = self._vm_row(instance, vm_id, VM_PROPERTIES)
            return None if row is None else _vm_info(row)

        return self._run(f"reading VM {vm_id!r}", read)

    def list_vms(self) -> Result[list[VMInfo], ProviderError]:
        """Each VM by its instanceUuid, as Create names it; the MoRefs read on the way are
        remembered, so that Describe of a listed VM needs no lookup."""

        def read(instance: Any) -> list[VMInfo]:
            rows = retrieve_all_vms(instance, VM_PROPERTIES)
            for row in rows:
                self._remember_moref(row)
            return [_vm_info(row) for row in rows]

        return self._run("listing VMs", read)

    # Lifecycle

    def find_by_name(self, name: str) -> Result[VMRecord | None, ProviderError]:
        return self._run(f"finding VM {name!r}", lambda instance: self._record(instance, name))

    def find_unfinished(self) -> Result[list[VMRecord], ProviderError]:
        """One listing of every VM's extraConfig: the simulator cannot select one key of it
        (`config.extraConfig["key"]`), and this runs at start-up and periodically only."""

        def read(instance: Any) -> list[VMRecord]:
            rows = retrieve_all_vms(instance, RECORD_PROPERTIES)
            records = [_vm_record(row) for row in rows]
            return [record for record in records if record.building_since is not None]

        return self._run("finding unfinished VMs", read)

    def start_create(
        self, request: CreateRequest, owner: OwnerMark
    ) -> Result[CreatedVM, ProviderError]:
        image = request.image
        if image.is_blank:
            return Failure(
                ProviderError.invalid_spec(
                    "image", "vSphere cannot make a blank root disk; set image.templateName"
                )
            )
        if not image.template_name or image.path or image.url:
            return Failure(
                ProviderError.invalid_spec(
                    "image.templateName", "vSphere creates VMs from a template or VM name only"
                )
            )

        def make(instance: Any) -> CreatedVM:
            source = self._vm_named(instance, image.template_name)
            if source is None:
                raise AdapterError(
                    ProviderError.invalid_spec(
                        "image.templateName", f"no template or VM named {image.template_name!r}"
                    )
                )
            version = hardware_version(request.vm_class)
            guest = guest_customization(
                request.networks, host_name="", domain="", time_zone="", field="networks"
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
                    _disk_growth(devices, growth)
                    + _new_disks(devices, request.disks)
                    + nic_changes(instance, devices, request.networks)
                    + class_devices(request.vm_class, devices, instance.content.about.apiVersion)
                )
                return spec

            return self._clone_from(
                instance,
                source,
                request.name,
                owner=owner,
                placement=request.placement,
                configure=configure,
                version=version,
                guest=guest,
            )

        return self._run(f"creating VM {request.name!r}", make)

    def start_clone(
        self, request: CloneRequest, owner: OwnerMark
    ) -> Result[CreatedVM, ProviderError]:
        """A linked clone shares the disks of the source's newest snapshot (child disks on
        top); a source without snapshots is refused rather than snapshotted behind its back."""
        customization = request.customization or Customization()

        def make(instance: Any) -> CreatedVM:
            guest = guest_customization(
                customization.networks,
                host_name=customization.hostname,
                domain=customization.domain,
                time_zone=customization.time_zone,
                field="customization",
            )
            source = self._vm(instance, request.source_vm_id)
            snapshot = self._newest_snapshot(instance, source) if request.linked else None

            def configure(devices: list[Any]) -> Any:
                extra = guestinfo(customization.user_data, _guest_metadata(customization))
                extra[OWNER_KEY] = owner.provider
                return vim.vm.ConfigSpec(
                    numCPUs=request.cpu,
                    memoryMB=request.memory_mib,
                    extraConfig=[
                        vim.option.OptionValue(key=key, value=value) for key, value in extra.items()
                    ],
                    deviceChange=nic_changes(instance, devices, customization.networks),
                )

            return self._clone_from(
                instance,
                source,
                request.target_name,
                owner=owner,
                placement=Placement(),
                configure=configure,
                snapshot=snapshot,
                guest=guest,
            )

        return self._run(f"cloning VM {request.source_vm_id!r}", make)

    def delete(self, vm_id: str) -> Result[None, ProviderError]:
        def remove(instance: Any) -> None:
            vm = self._vm(instance, vm_id)
            if self._power(instance, vm) is PowerState.ON:
                self._wait(instance, vm.PowerOffVM_Task())
            self._wait(instance, vm.Destroy_Task())

        return self._run(f"deleting VM {vm_id!r}", remove)

    def reconfigure(self, vm_id: str, changes: VMChanges) -> Result[TaskRef | None, ProviderError]:
        return self._begin(self._reconfiguration(vm_id, changes))

    def upgrade_hardware(
        self, vm_id: str, target_version: int
    ) -> Result[TaskRef | None, ProviderError]:
        return self._begin(self._hardware_upgrade(vm_id, target_version))

    # Power

    def power_state(self, vm_id: str) -> Result[PowerState, ProviderError]:
        return self._run(
            f"reading power of VM {vm_id!r}",
            lambda instance: self._power(instance, self._vm(instance, vm_id)),
        )

    def power_on(self, vm_id: str) -> Result[TaskRef | None, ProviderError]:
        return self._begin(self._power_change(vm_id, PowerState.ON))

    def power_off(self, vm_id: str) -> Result[TaskRef | None, ProviderError]:
        return self._begin(self._power_change(vm_id, PowerState.OFF))

    def reboot(self, vm_id: str) -> Result[TaskRef | None, ProviderError]:
        """The guest reboots itself (no Task: None), or the reset Task when it cannot."""

        def start(instance: Any) -> Any:
            vm = self._vm(instance, vm_id)
            try:
                vm.RebootGuest()
            except EXPECTED_FAILURES as error:
                if is_missing(error):
                    raise
                # No guest tools (or, on the simulator, no RebootGuest at all): reset instead.
                return vm.ResetVM_Task()
            return None

        return self._begin(TaskOperation(f"rebooting VM {vm_id!r}", vm_id, start))

    def request_shutdown(self, vm_id: str, deadline: int) -> Result[None, ProviderError]:
        def ask(instance: Any) -> None:
            vm = self._vm(instance, vm_id)
            self._set_extra_config(instance, vm, {SHUTDOWN_DEADLINE_KEY: str(deadline)})
            if self._power(instance, vm) is PowerState.ON:
                with contextlib.suppress(vim.fault.ToolsUnavailable):
                    # No VMware Tools to ask: the recorded deadline still forces the power-off.
                    vm.ShutdownGuest()

        return self._run(f"shutting down VM {vm_id!r}", ask)

    def shutdown_deadline(self, vm_id: str) -> Result[int | None, ProviderError]:
        def read(instance: Any) -> int | None:
            value = self._extra_config(instance, vm_id).get(SHUTDOWN_DEADLINE_KEY, "")
            return int(value) if value.isdigit() else None

        return self._run(f"reading VM {vm_id!r}", read)

    def clear_shutdown_deadline(self, vm_id: str) -> Result[None, ProviderError]:
        return self._run(
            f"updating VM {vm_id!r}",
            lambda instance: self._set_extra_config(
                instance, self._vm(instance, vm_id), {SHUTDOWN_DEADLINE_KEY: ""}
            ),
        )

    # Snapshots

    def create_snapshot(self, request: SnapshotRequest) -> Result[Snapshot, ProviderError]:
        def take(instance: Any) -> Snapshot:
            vm = self._vm(instance, request.vm_id)
            task = vm.CreateSnapshot_Task(
                name=request.name,
                description=request.description,
                memory=request.include_memory,
                quiesce=False,
            )
            snapshot = self._wait(instance, task)
            return Snapshot(
                id=str(snapshot._moId),
                name=request.name,
                description=request.description,
                include_memory=request.include_memory,
            )

        return self._run(f"snapshotting VM {request.vm_id!r}", take)

    def delete_snapshot(
        self, vm_id: str, snapshot_id: str
    ) -> Result[TaskRef | None, ProviderError]:
        return self._begin(self._snapshot_removal(vm_id, snapshot_id))

    def revert_snapshot(
        self, vm_id: str, snapshot_id: str
    ) -> Result[TaskRef | None, ProviderError]:
        return self._begin(self._snapshot_revert(vm_id, snapshot_id))

    # Disks and images

    def disk_details(self, query: DiskQuery) -> Result[DiskDetails, ProviderError]:
        def read(instance: Any) -> DiskDetails:
            row = self._vm_row(instance, query.vm_id, ("config.hardware.device",))
            if row is None:
                raise AdapterError(ProviderError.vm_not_found(query.vm_id))
            disks = _disks(row)
            wanted = [d for d in disks if not query.disk_id or str(d.key) == query.disk_id]
            if not wanted:
                raise AdapterError(ProviderError.not_found(f"disk {query.disk_id!r} not found"))
            disk = wanted[0]
            parent = getattr(disk.backing, "parent", None)
            return DiskDetails(
                disk_id=str(disk.key),
                format="vmdk",
                path=str(disk.backing.fileName),
                virtual_size_bytes=int(disk.capacityInKB) * 1024,
                is_bootable=disk is disks[0],
                backing_file=str(parent.fileName) if parent is not None else "",
            )

        return self._run(f"reading disks of VM {query.vm_id!r}", read)

    def prepare_image(self, request: PrepareImageRequest) -> Result[PreparedImage, ProviderError]:
        """vSphere imports nothing (yet): preparing an image verifies that the template named
        in templateName exists, and its name is the prepared image's id (what Create takes)."""
        source = request.source
        library = source.content_library
        if source.url:
            return Failure(
                ProviderError.unsupported(
                    "importing an OVA/OVF from a URL is not implemented for vSphere; import it "
                    "into vCenter as a template and name it in templateName"
                )
            )
        if library is not None and (library.library or library.item):
            return Failure(
                ProviderError.unsupported(
                    "content library items are not implemented for vSphere; deploy the item as "
                    "a template and name it in templateName"
                )
            )
        if not source.template_name:
            return Failure(
                ProviderError.unsupported(
                    "vSphere imports no disk images; ImagePrepare verifies an existing template "
                    "named in templateName"
                )
            )
        name = source.template_name

        def verify(instance: Any) -> PreparedImage:
            if self._vm_named(instance, name) is None:
                raise AdapterError(
                    ProviderError.not_found(f"no template or VM named {name!r} on this endpoint")
                )
            return PreparedImage(id=name)

        return self._run(f"verifying template {name!r}", verify)

    def export_disk(self, request: ExportRequest) -> Result[ExportResult, ProviderError]:
        return Failure(ProviderError.unsupported("disk export is not implemented for vSphere"))

    def import_disk(self, request: ImportRequest) -> Result[ImportResult, ProviderError]:
        return Failure(ProviderError.unsupported("disk import is not implemented for vSphere"))

    # Internals

    def _run(self, doing: str, operation: Callable[[Any], T]) -> Result[T, ProviderError]:
        try:
            return Success(self._session.call(operation))
        except AdapterError as error:
            return Failure(error.error)
        except EXPECTED_FAILURES as error:
            return Failure(provider_error(error, doing))

    def _vm(self, instance: Any, vm_id: str) -> Any:
        """The VM's MoRef, checked to exist (one round trip); NOT_FOUND otherwise."""
        row = self._vm_row(instance, vm_id, ("name",))
        if row is None:
            raise AdapterError(ProviderError.vm_not_found(vm_id))
        return row["_ref"]

    def _vm_row(
        self, instance: Any, vm_id: str, properties: tuple[str, ...]
    ) -> dict[str, Any] | None:
        moref = self._moref(instance, vm_id)
        if moref is None:
            return None
        try:
            rows = retrieve(instance, [vim.VirtualMachine(moref, instance._stub)], properties)
        except EXPECTED_FAILURES as error:
            if is_missing(error):
                return None
            raise
        return rows[0] if rows else None

    def _remember_moref(self, row: Mapping[str, Any]) -> None:
        instance_uuid = str(row.get("config.instanceUuid") or "").lower()
        if instance_uuid:
            self._morefs.setdefault(instance_uuid, str(row["_ref"]._moId))

    def _moref(self, instance: Any, vm_id: str) -> str | None:
        """The MoRef value a VM id names (None: no VM); an instanceUuid is looked up once."""
        if not INSTANCE_UUID.fullmatch(vm_id):
            return vm_id if MOREF_VALUE.fullmatch(vm_id) else None
        key = vm_id.lower()
        known = self._morefs.get(key)
        if known is None:
            found = instance.content.searchIndex.FindByUuid(
                uuid=key, vmSearch=True, instanceUuid=True
            )
            if found is None:
                return None
            known = self._morefs.setdefault(key, str(found._moId))
        return known

    def _console_url(self, instance: Any, vm_id: str) -> str:
        """The VM's page in the vSphere Client (or the ESXi Host Client), from the login's
        ServiceContent: no round trip."""
        about = instance.content.about
        origin = self._session.web_origin
        if about.apiType == "HostAgent":
            return f"{origin}/ui/#/host/vms/{vm_id}"
        urn = f"urn:vmomi:VirtualMachine:{vm_id}:{about.instanceUuid}"
        return f"{origin}/ui/#?extensionId=vsphere.core.vm.summary&objectId={urn}"

    def _devices(self, instance: Any, vm: Any) -> list[Any]:
        row = self._vm_row(instance, vm._moId, ("config.hardware.device",))
        return list((row or {}).get("config.hardware.device") or ())

    def _vm_named(self, instance: Any, name: str) -> Any:
        rows = [row for row in retrieve_all_vms(instance, ("name",)) if row.get("name") == name]
        return rows[0]["_ref"] if rows else None

    def _record(self, instance: Any, name: str) -> VMRecord | None:
        vm = self._vm_named(instance, name)
        if vm is None:
            return None
        row = self._vm_row(instance, vm._moId, RECORD_PROPERTIES)
        return None if row is None else _vm_record(row)

    def _extra_config(self, instance: Any, vm_id: str) -> dict[str, str]:
        row = self._vm_row(instance, vm_id, ("config.extraConfig",))
        if row is None:
            raise AdapterError(ProviderError.vm_not_found(vm_id))
        return extra_config(row)

    def _set_extra_config(self, instance: Any, vm: Any, values: Mapping[str, str]) -> None:
        options = [vim.option.OptionValue(key=key, value=value) for key, value in values.items()]
        self._wait(instance, vm.ReconfigVM_Task(vim.vm.ConfigSpec(extraConfig=options)))

    def _power(self, instance: Any, vm: Any) -> PowerState:
        row = self._vm_row(instance, vm._moId, ("runtime.powerState",))
        if row is None:
            raise AdapterError(ProviderError.vm_not_found(vm._moId))
        return _power_state(row)

    # Operations that are one vSphere Task each, handed back as a task id at once.

    def _begin(self, operation: TaskOperation) -> Result[TaskRef | None, ProviderError]:
        """None when no Task was needed (already in the state asked for, or a guest reboot)."""

        def run(instance: Any) -> TaskRef | None:
            task = operation.start(instance)
            if task is None:
                return None
            return VSphereTask(task=str(task._moId), vm_id=operation.vm_id).task_ref()

        return self._run(operation.doing, run)

    def _reconfiguration(self, vm_id: str, changes: VMChanges) -> TaskOperation:
        def start(instance: Any) -> Any:
            row = self._vm_row(instance, vm_id, RECONFIGURE_PROPERTIES)
            if row is None:
                raise AdapterError(ProviderError.vm_not_found(vm_id))
            _refuse_offline_only_changes(row, changes)
            spec = vim.vm.ConfigSpec(
                numCPUs=changes.cpu,
                memoryMB=changes.memory_mib,
                deviceChange=_disk_growth(list(row.get("config.hardware.device") or ()), changes),
            )
            return row["_ref"].ReconfigVM_Task(spec)

        return TaskOperation(f"reconfiguring VM {vm_id!r}", vm_id, start)

    def _hardware_upgrade(self, vm_id: str, target_version: int) -> TaskOperation:
        version = f"vmx-{target_version:02d}" if target_version else None
        return TaskOperation(
            f"upgrading VM {vm_id!r}",
            vm_id,
            lambda instance: self._vm(instance, vm_id).UpgradeVM_Task(version),
        )

    def _power_change(self, vm_id: str, target: PowerState) -> TaskOperation:
        def start(instance: Any) -> Any:
            vm = self._vm(instance, vm_id)
            if self._power(instance, vm) is target:
                return None
            return vm.PowerOnVM_Task() if target is PowerState.ON else vm.PowerOffVM_Task()

        return TaskOperation(f"powering VM {vm_id!r} {target.value}", vm_id, start)

    def _snapshot_removal(self, vm_id: str, snapshot_id: str) -> TaskOperation:
        return TaskOperation(
            f"deleting snapshot {snapshot_id!r}",
            vm_id,
            lambda instance: self._snapshot(instance, vm_id, snapshot_id).RemoveSnapshot_Task(
                False
            ),
        )

    def _snapshot_revert(self, vm_id: str, snapshot_id: str) -> TaskOperation:
        return TaskOperation(
            f"reverting to snapshot {snapshot_id!r}",
            vm_id,
            lambda instance: self._snapshot(instance, vm_id, snapshot_id).RevertToSnapshot_Task(),
        )

    def _snapshot(self, instance: Any, vm_id: str, snapshot_id: str) -> Any:
        for tree in self._snapshot_trees(instance, vm_id):
            if snapshot_id in (tree.snapshot._moId, tree.name):
                return tree.snapshot
        raise AdapterError(
            ProviderError.not_found(f"snapshot {snapshot_id!r} of VM {vm_id!r} not found")
        )

    def _newest_snapshot(self, instance: Any, vm: Any) -> Any:
        trees = self._snapshot_trees(instance, vm._moId)
        if not trees:
            raise AdapterError(
                ProviderError.failed_precondition(
                    f"a linked clone shares the disks of a snapshot, and VM {vm._moId!r} has "
                    "none; take one with SnapshotCreate first, or ask for a full clone"
                )
            )
        return max(trees, key=lambda tree: (tree.createTime, tree.id)).snapshot

    def _snapshot_trees(self, instance: Any, vm_id: str) -> list[Any]:
        """Every snapshot of the VM (one round trip), flattened from the snapshot tree."""
        row = self._vm_row(instance, vm_id, ("snapshot",))
        if row is None:
            raise AdapterError(ProviderError.vm_not_found(vm_id))
        info = row.get("snapshot")
        pending = list(info.rootSnapshotList) if info is not None else []
        trees = []
        for _ in range(100_000):
            if not pending:
                break
            tree = pending.pop()
            trees.append(tree)
            pending.extend(tree.childSnapshotList or ())
        return trees

    def _clone_from(
        self,
        instance: Any,
        source: Any,
        name: str,
        *,
        owner: OwnerMark,
        placement: Placement,
        configure: Callable[[list[Any]], Any],
        version: str | None = None,
        snapshot: Any = None,
        guest: GuestCustomization | None = None,
    ) -> CreatedVM:
        """Clone `source` powered off where `placement` (or the defaults, or the source) says,
        with `configure(devices)` and the `guest` customization in the clone spec, and return
        at once: vCenter makes the VM whole in the clone task or not at all (it finishes a
        started clone whoever asked, and cleans up a failed one). The id is the instanceUuid
        chosen here, as the MoRef exists only once the task is done. With `snapshot`, the
        clone is linked: child disks on top of that snapshot's. A hardware version cannot be
        set in a clone: with `version`, the VM is built in steps within the call instead."""
        existing = self._record(instance, name)
        if existing is not None:
            if existing.owner == owner:
                return CreatedVM(id=existing.id)
            raise AdapterError(
                ProviderError.already_exists(f"a VM named {name!r} exists and is not ours")
            )
        location = resolve(instance, merged(placement, self._defaults), source)
        instance_uuid = str(uuid.uuid4())
        clone_spec = vim.vm.CloneSpec(
            location=vim.vm.RelocateSpec(
                pool=location.pool,
                datastore=location.datastore,
                host=location.host,
                diskMoveType=None if snapshot is None else "createNewChildDiskBacking",
            ),
            snapshot=snapshot,
            powerOn=False,
            template=False,
        )
        if version is not None:
            return self._build_in_steps(
                instance,
                source,
                name,
                folder=location.folder,
                clone_spec=clone_spec,
                instance_uuid=instance_uuid,
                owner=owner,
                configure=configure,
                version=version,
                guest=guest,
            )
        devices = self._devices(instance, source)
        clone_spec.config = configure(devices)
        clone_spec.config.instanceUuid = instance_uuid
        if guest is not None:
            clone_spec.customization = guest.spec(
                _nic_count(devices, clone_spec.config.deviceChange)
            )
        task = source.CloneVM_Task(folder=location.folder, name=name, spec=clone_spec)
        started = VSphereTask(task=str(task._moId), vm_id=instance_uuid)
        return CreatedVM(id=instance_uuid, task=started.task_ref())

    def _build_in_steps(
        self,
        instance: Any,
        source: Any,
        name: str,
        *,
        folder: Any,
        clone_spec: Any,
        instance_uuid: str,
        owner: OwnerMark,
        configure: Callable[[list[Any]], Any],
        version: str,
        guest: GuestCustomization | None,
    ) -> CreatedVM:
        """Clone marked as building, upgrade the hardware, then configure and customize; a
        failure after the clone exists destroys it again, and the last step clears the mark,
        so the VM is unmarked only once complete."""
        # Whole seconds, rounded down: the mark never claims a start later than the real one.
        marks = {OWNER_KEY: owner.provider, BUILDING_KEY: str(int(self._clock.now()))}
        # The marks exist as soon as the VM does, so a racing replica can adopt it and a
        # crash part-way leaves a VM that is known to be unfinished.
        clone_spec.config = vim.vm.ConfigSpec(
            instanceUuid=instance_uuid,
            extraConfig=[
                vim.option.OptionValue(key=key, value=value) for key, value in marks.items()
            ],
        )
        try:
            clone = self._wait(
                instance, source.CloneVM_Task(folder=folder, name=name, spec=clone_spec)
            )
        except vim.fault.DuplicateName:
            # Another replica won the race on vCenter: adopt its VM when it is ours.
            raced = self._record(instance, name)
            if raced is not None and raced.owner == owner:
                return CreatedVM(id=raced.id)
            raise
        try:
            self._wait(instance, clone.UpgradeVM_Task(version))
            devices = self._devices(instance, clone)
            spec = configure(devices)
            finished = vim.option.OptionValue(key=BUILDING_KEY, value="")
            if guest is None:
                spec.extraConfig = [*(spec.extraConfig or ()), finished]
            self._wait(instance, clone.ReconfigVM_Task(spec))
            if guest is not None:
                nics = _nic_count(devices, spec.deviceChange)
                self._wait(instance, clone.CustomizeVM_Task(guest.spec(nics)))
                self._set_extra_config(instance, clone, {BUILDING_KEY: ""})
        except BaseException:
            # Leave no half-built VM behind; the original failure is what the caller sees.
            with contextlib.suppress(AdapterError, *EXPECTED_FAILURES):
                self._wait(instance, clone.Destroy_Task())
            raise
        return CreatedVM(id=instance_uuid)

    def _wait(self, instance: Any, task: Any) -> Any:
        """The task's result once it ends, reading only info.state/error/result (bounded wait)."""
        deadline = time.monotonic() + TASK_DEADLINE_SECONDS
        delay = 0.05
        while True:
            found = progress(instance, task)
            if found is None:
                raise AdapterError(ProviderError.unavailable(f"vSphere task {task._moId} vanished"))
            if found.succeeded:
                return retrieve(instance, [task], ("info.result",))[0].get("info.result")
            if found.failed:
                raise (
                    found.error
                    if isinstance(found.error, BaseException)
                    else AdapterError(ProviderError.internal(_fault_message(found.error)))
                )
            if time.monotonic() > deadline:
                raise AdapterError(ProviderError.unavailable("vSphere task did not finish in time"))
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


@dataclass(frozen=True)
class TaskOperation:
    """An operation that is one vSphere Task: `start` returns it (None: nothing to do)."""

    doing: str  # for error messages: "reconfiguring VM 'vm-42'"
    vm_id: str
    start: Callable[[Any], Any]


def _fault_message(fault: Any) -> str:
    """A failed task's fault as ProviderError text (kind and message, never a traceback)."""
    if isinstance(fault, BaseException):
        return str(provider_error(fault, "vSphere task failed"))
    return f"vSphere task failed: {fault}"


def _vm_record(row: Mapping[str, Any]) -> VMRecord:
    """Id, name, ownership and building marks from a row with RECORD_PROPERTIES. The id is
    the instanceUuid, as Create returns it (the MoRef for a VM without one).

    A building mark set to "" was cleared (vCenter removes the key, the simulator keeps it)."""
    extra = extra_config(row)
    owner = extra.get(OWNER_KEY, "")
    return VMRecord(
        id=_vm_id(row),
        name=str(row.get("name", "")),
        owner=OwnerMark(provider=owner) if owner else None,
        building_since=_unix_time(extra.get(BUILDING_KEY, "")),
    )


def _unix_time(value: str) -> float | None:
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) else None


def _power_state(row: Mapping[str, Any]) -> PowerState:
    on = row.get("runtime.powerState") == vim.VirtualMachinePowerState.poweredOn
    return PowerState.ON if on else PowerState.OFF


def _ips(row: Mapping[str, Any]) -> tuple[str, ...]:
    found = [str(ip) for nic in row.get("guest.net") or () for ip in nic.ipAddress or ()]
    return routable_addresses(found)


def _disks(row: Mapping[str, Any]) -> list[Any]:
    devices = row.get("config.hardware.device") or ()
    return [device for device in devices if isinstance(device, vim.vm.device.VirtualDisk)]


def _vm_id(row: Mapping[str, Any]) -> str:
    """The VM's id as Create returns it: its instanceUuid (the MoRef for a VM without one)."""
    return str(row.get("config.instanceUuid") or row["_ref"]._moId)


def _vm_info(row: Mapping[str, Any]) -> VMInfo:
    devices = row.get("config.hardware.device") or ()
    nics = [d for d in devices if isinstance(d, vim.vm.device.VirtualEthernetCard)]
    return VMInfo(
        id=_vm_id(row),
        name=str(row.get("name", "")),
        power_state=_power_state(row),
        ips=_ips(row),
        cpu=int(row.get("config.hardware.numCPU") or 0),
        memory_mib=int(row.get("config.hardware.memoryMB") or 0),
        disks=tuple(
            DiskInfo(
                id=str(disk.key),
                path=str(disk.backing.fileName),
                size_gib=int(disk.capacityInKB) // (1024 * 1024),
                format="vmdk",
            )
            for disk in _disks(row)
        ),
        networks=tuple(
            NetworkInfo(
                name=str(nic.deviceInfo.summary if nic.deviceInfo else ""),
                mac=str(nic.macAddress or ""),
            )
            for nic in nics
        ),
    )


def _guest_metadata(customization: Customization) -> bytes:
    """cloud-init metadata carrying the host name (FQDN when a domain is given)."""
    if not customization.hostname:
        return b""
    name = customization.hostname
    if customization.domain:
        name = f"{name}.{customization.domain}"
    return json.dumps({"local-hostname": name}).encode()


def _refuse_offline_only_changes(row: Mapping[str, Any], changes: VMChanges) -> None:
    """A running VM takes CPU and memory changes only with hot-add enabled, and never shrinks."""
    if _power_state(row) is PowerState.OFF:
        return
    cpu_now = int(row.get("config.hardware.numCPU") or 0)
    memory_now = int(row.get("config.hardware.memoryMB") or 0)
    if changes.cpu is not None and changes.cpu != cpu_now:
        if not row.get("config.cpuHotAddEnabled"):
            raise AdapterError(
                ProviderError.failed_precondition("CPU hot-add disabled; power off to change CPUs")
            )
        if changes.cpu < cpu_now:
            raise AdapterError(
                ProviderError.failed_precondition("CPUs cannot shrink while the VM runs")
            )
    if changes.memory_mib is not None and changes.memory_mib != memory_now:
        if not row.get("config.memoryHotAddEnabled"):
            raise AdapterError(
                ProviderError.failed_precondition(
                    "memory hot-add disabled; power off to change memory"
                )
            )
        if changes.memory_mib < memory_now:
            raise AdapterError(
                ProviderError.failed_precondition("memory cannot shrink while the VM runs")
            )


def _disk_growth(devices: list[Any], changes: VMChanges) -> list[Any]:
    """Edit specs growing the root disk and the extra disks (by position); disks never shrink."""
    disks = [d for d in devices if isinstance(d, vim.vm.device.VirtualDisk)]
    wanted: list[int | None] = [changes.root_disk_gib, *(spec.size_gib for spec in changes.disks)]
    edits = []
    for disk, size_gib in zip(disks, wanted, strict=False):
        if size_gib is None:
            continue
        if size_gib * 1024 * 1024 < disk.capacityInKB:
            raise AdapterError(ProviderError.failed_precondition(f"disk {disk.key} cannot shrink"))
        disk.capacityInKB = size_gib * 1024 * 1024
        disk.capacityInBytes = size_gib * GIB
        edits.append(vim.vm.device.VirtualDeviceSpec(operation="edit", device=disk))
    if len(changes.disks) > max(len(disks) - 1, 0):
        raise AdapterError(ProviderError.invalid_spec("disks", "only existing disks can grow"))
    return edits


def _new_disks(devices: list[Any], disks: tuple[DiskSpec, ...]) -> list[Any]:
    """Add specs for extra disks (thin unless asked otherwise) on the first SCSI controller."""
    if not disks:
        return []
    provisioning = [_provisioning(spec, index) for index, spec in enumerate(disks)]
    controllers = [d for d in devices if isinstance(d, vim.vm.device.VirtualSCSIController)]
    if not controllers:
        raise AdapterError(
            ProviderError.failed_precondition("the VM has no SCSI controller for extra disks")
        )
    controller = controllers[0]
    used = {d.unitNumber for d in devices if d.controllerKey == controller.key}
    free = [unit for unit in range(16) if unit != 7 and unit not in used]
    if len(free) < len(disks):
        raise AdapterError(ProviderError.resource_exhausted("no free SCSI unit for another disk"))
    return [
        vim.vm.device.VirtualDeviceSpec(
            operation="add",
            fileOperation="create",
            device=vim.vm.device.VirtualDisk(
                key=-100 - index,
                controllerKey=controller.key,
                unitNumber=unit,
                capacityInKB=spec.size_gib * 1024 * 1024,
                backing=vim.vm.device.VirtualDisk.FlatVer2BackingInfo(
                    diskMode="persistent",
                    thinProvisioned=thin,
                    eagerlyScrub=eager,
                    fileName="",
                ),
            ),
        )
        for index, (spec, unit, (thin, eager)) in enumerate(
            zip(disks, free, provisioning, strict=False)
        )
    ]


def _provisioning(spec: DiskSpec, index: int) -> tuple[bool, bool]:
    """(thinProvisioned, eagerlyScrub) for the disk type the request names."""
    kind = spec.type.strip().lower() or "thin"
    if kind not in DISK_PROVISIONING:
        known = ", ".join(DISK_PROVISIONING)
        raise AdapterError(
            ProviderError.invalid_spec(f"disks[{index}].type", f"one of {known}, got {spec.type!r}")
        )
    return DISK_PROVISIONING[kind]


def _nic_count(devices: list[Any], changes: list[Any] | None) -> int:
    """How many NICs the VM has once `changes` are applied to `devices`."""
    count = sum(isinstance(device, vim.vm.device.VirtualEthernetCard) for device in devices)
    for change in changes or ():
        if isinstance(change.device, vim.vm.device.VirtualEthernetCard):
            count += {"add": 1, "remove": -1}.get(str(change.operation), 0)
    return count


def vsphere_hypervisor(
    endpoint: str,
    credentials: Credentials,
    insecure: bool,
    defaults: Placement | None = None,
    clock: Clock | None = None,
    *,
    on_relogin: Callable[[], None] = lambda: None,
) -> VSphereHypervisor:
    """The adapter as the composition root builds it (no round trip until the first call)."""
    session = VSphereSession(endpoint, credentials_from(credentials), insecure, on_relogin)
    return VSphereHypervisor(session, defaults, clock)
