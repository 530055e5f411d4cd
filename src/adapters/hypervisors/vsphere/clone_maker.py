"""Making a VM as a clone of another: how vSphere makes every VM (Create clones a template,
Clone a VM).

vCenter makes the VM whole in the clone task or not at all (it finishes a started clone
whoever asked, and cleans up a failed one), and refuses a second VM of the same name with
DuplicateName: a name in use is reported as ALREADY_EXISTS, and whether that VM is ours to
return is the application's ownership rule to decide.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from pyVmomi import vim as untyped_vim
from returns.result import Failure, Result

from pyrigaud.adapters.hypervisors.cleanup import undone_on_failure
from pyrigaud.adapters.hypervisors.vsphere.calls import best_effort
from pyrigaud.adapters.hypervisors.vsphere.customization import GuestCustomization
from pyrigaud.adapters.hypervisors.vsphere.devices import nic_count
from pyrigaud.adapters.hypervisors.vsphere.placement import Location, merged, resolve
from pyrigaud.adapters.hypervisors.vsphere.tasks import VSphereTask, destroyed, ended, wait
from pyrigaud.adapters.hypervisors.vsphere.vcenter import VCenter
from pyrigaud.adapters.hypervisors.vsphere.vm_rows import BUILDING_KEY, building_marks
from pyrigaud.application.ports import Clock
from pyrigaud.application.ports.vm_lifecycle import CreatedVM
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import OwnerMark, Placement

# pyVmomi's stubs leave its data-object constructors untyped: use them dynamically.
vim: Any = untyped_vim


@dataclass(frozen=True)
class CloneOrder:
    """What to clone from, under which name, and how to shape the copy.

    `configure(devices)` gives the ConfigSpec for the copy of a source with those devices;
    with `snapshot`, the clone is linked (child disks on top of that snapshot's); with
    `version`, the hardware is upgraded to it, which a clone cannot do in its own spec."""

    source: Any
    name: str
    owner: OwnerMark
    placement: Placement
    configure: Callable[[list[Any]], Result[Any, ProviderError]]
    version: str | None = None
    snapshot: Any = None
    guest: GuestCustomization | None = None


class CloneMaker:
    """Create's and Clone's shared last step: the clone that makes the VM."""

    def __init__(self, vcenter: VCenter, defaults: Placement, clock: Clock) -> None:
        """`defaults` are the PROVIDER_DEFAULT_* placement settings; `clock` dates the
        building mark (the wall clock that every replica shares)."""
        self._vcenter = vcenter
        self._defaults = defaults
        self._clock = clock

    def clone(self, instance: Any, order: CloneOrder) -> Result[CreatedVM, ProviderError]:
        """Clone the source powered off where the placement (or the defaults, or the source)
        says, with its configuration and guest customization in the clone spec, and return at
        once. The id is the instanceUuid chosen here, as the MoRef exists only once the task
        is done. With a hardware version, the VM is built in steps within the call instead."""
        if self._vcenter.vm_named(instance, order.name) is not None:
            return Failure(
                ProviderError.already_exists(f"a VM named {order.name!r} already exists")
            )
        return resolve(instance, merged(order.placement, self._defaults), order.source).bind(
            partial(self._clone_at, instance, order)
        )

    def _clone_at(
        self, instance: Any, order: CloneOrder, location: Location
    ) -> Result[CreatedVM, ProviderError]:
        instance_uuid = str(uuid.uuid4())
        clone_spec = vim.vm.CloneSpec(
            location=vim.vm.RelocateSpec(
                pool=location.pool,
                datastore=location.datastore,
                host=location.host,
                diskMoveType=None if order.snapshot is None else "createNewChildDiskBacking",
            ),
            snapshot=order.snapshot,
            powerOn=False,
            template=False,
        )
        if order.version is not None:
            return self._build_in_steps(
                instance,
                order,
                version=order.version,
                folder=location.folder,
                clone_spec=clone_spec,
                instance_uuid=instance_uuid,
            )
        devices = self._vcenter.devices(instance, order.source)

        def started(config: Any) -> CreatedVM:
            clone_spec.config = config
            config.instanceUuid = instance_uuid
            if order.guest is not None:
                clone_spec.customization = order.guest.spec(nic_count(devices, config.deviceChange))
            task = order.source.CloneVM_Task(
                folder=location.folder, name=order.name, spec=clone_spec
            )
            begun = VSphereTask(task=str(task._moId), vm_id=instance_uuid)
            return CreatedVM(id=instance_uuid, task=begun.task_ref())

        return order.configure(devices).map(started)

    def _build_in_steps(
        self,
        instance: Any,
        order: CloneOrder,
        *,
        version: str,
        folder: Any,
        clone_spec: Any,
        instance_uuid: str,
    ) -> Result[CreatedVM, ProviderError]:
        """Clone marked as building, upgrade the hardware, then configure and customize; a
        failure after the clone exists destroys it again, and the last step clears the mark,
        so the VM is unmarked only once complete.

        A racing replica's clone of the same name fails with DuplicateName (ALREADY_EXISTS)."""
        # Whole seconds, rounded down: the mark never claims a start later than the real one.
        marks = building_marks(order.owner.provider, self._clock.now())
        # The marks exist as soon as the VM does, so a racing replica sees whose it is and
        # a crash part-way leaves a VM that is known to be unfinished.
        clone_spec.config = vim.vm.ConfigSpec(
            instanceUuid=instance_uuid,
            extraConfig=[
                vim.option.OptionValue(key=key, value=value) for key, value in marks.items()
            ],
        )
        made = wait(
            instance, order.source.CloneVM_Task(folder=folder, name=order.name, spec=clone_spec)
        )

        def created(_finished: None) -> CreatedVM:
            return CreatedVM(id=instance_uuid)

        return made.bind(partial(self._finished, instance, order, version=version)).map(created)

    def _finished(
        self, instance: Any, order: CloneOrder, clone: Any, version: str
    ) -> Result[None, ProviderError]:
        """The clone upgraded, configured and customized, or destroyed again: no half-built VM
        stays behind, and the original failure is what the caller sees."""

        def configured(devices: list[Any]) -> Result[None, ProviderError]:
            return order.configure(devices).bind(
                partial(self._configured, instance, order, clone, devices)
            )

        def finished() -> Result[None, ProviderError]:
            return self._upgraded(instance, clone, version).bind(configured)

        return undone_on_failure(finished, partial(_destroy, instance, clone))

    def _upgraded(
        self, instance: Any, clone: Any, version: str
    ) -> Result[list[Any], ProviderError]:
        """The clone's devices once its hardware is at `version`."""

        def devices(_upgraded: object) -> list[Any]:
            return self._vcenter.devices(instance, clone)

        return wait(instance, clone.UpgradeVM_Task(version)).map(devices)

    def _configured(
        self, instance: Any, order: CloneOrder, clone: Any, devices: list[Any], spec: Any
    ) -> Result[None, ProviderError]:
        """The class applied, then the guest customized; the building mark goes with the last
        step."""
        finished = vim.option.OptionValue(key=BUILDING_KEY, value="")
        guest = order.guest
        if guest is None:
            spec.extraConfig = [*(spec.extraConfig or ()), finished]
            return ended(instance, clone.ReconfigVM_Task(spec))
        nics = nic_count(devices, spec.deviceChange)

        def customized(_reconfigured: object) -> Result[Any, ProviderError]:
            return wait(instance, clone.CustomizeVM_Task(guest.spec(nics)))

        def unmarked(_customized: object) -> Result[None, ProviderError]:
            return self._vcenter.set_extra_config(instance, clone, {BUILDING_KEY: ""})

        return wait(instance, clone.ReconfigVM_Task(spec)).bind(customized).bind(unmarked)


def _destroy(instance: Any, clone: Any) -> None:
    """Destroy a half-built clone; the caller's failure is the one told (so this cleanup's
    own is not)."""
    best_effort(partial(destroyed, instance, clone))
