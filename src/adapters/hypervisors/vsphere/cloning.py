"""Cloning on vSphere: a full clone, or a linked one sharing the disks of the source's newest
snapshot, with the class and guest customization in the clone spec."""

from __future__ import annotations

import json
from functools import partial
from operator import attrgetter
from typing import Any

from pyVmomi import vim as untyped_vim
from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.vsphere.calls import run
from pyrigaud.adapters.hypervisors.vsphere.class_spec import guestinfo
from pyrigaud.adapters.hypervisors.vsphere.clone_maker import CloneMaker, CloneOrder
from pyrigaud.adapters.hypervisors.vsphere.customization import guest_customization
from pyrigaud.adapters.hypervisors.vsphere.networks import CLONE_ATTACHMENTS, nic_changes
from pyrigaud.adapters.hypervisors.vsphere.snapshots import snapshot_trees
from pyrigaud.adapters.hypervisors.vsphere.vcenter import VCenter
from pyrigaud.adapters.hypervisors.vsphere.vm_rows import OWNER_KEY
from pyrigaud.application.ports.vm_lifecycle import CreatedVM
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import CloneRequest, Customization, OwnerMark, Placement

# pyVmomi's stubs leave its data-object constructors untyped: use them dynamically.
vim: Any = untyped_vim


class VSphereCloning:
    def __init__(self, vcenter: VCenter, clone_maker: CloneMaker) -> None:
        self._vcenter = vcenter
        self._clone_maker = clone_maker

    def start_clone(
        self, request: CloneRequest, owner: OwnerMark
    ) -> Result[CreatedVM, ProviderError]:
        """A linked clone shares the disks of the source's newest snapshot (child disks on
        top); a source without snapshots is refused rather than snapshotted behind its back.
        ALREADY_EXISTS when a VM of the target name exists, whoever made it."""
        customization = request.customization or Customization()

        def make(instance: Any) -> Result[CreatedVM, ProviderError]:
            def configure(devices: list[Any]) -> Result[Any, ProviderError]:
                extra = guestinfo(customization.user_data, _guest_metadata(customization))
                extra[OWNER_KEY] = owner.provider

                def spec(changes: list[Any]) -> Any:
                    return vim.vm.ConfigSpec(
                        numCPUs=request.cpu,
                        memoryMB=request.memory_mib,
                        extraConfig=[
                            vim.option.OptionValue(key=key, value=value)
                            for key, value in extra.items()
                        ],
                        deviceChange=changes,
                    )

                return nic_changes(
                    instance, devices, customization.networks, CLONE_ATTACHMENTS
                ).map(spec)

            order = Result.do(
                CloneOrder(
                    source=source,
                    name=request.target_name,
                    owner=owner,
                    placement=Placement(),
                    configure=configure,
                    snapshot=snapshot,
                    guest=guest,
                )
                for guest in guest_customization(
                    customization.networks,
                    host_name=customization.hostname,
                    domain=customization.domain,
                    time_zone=customization.time_zone,
                    named=CLONE_ATTACHMENTS,
                )
                for source in self._vcenter.vm(instance, request.source_vm_id)
                for snapshot in (
                    self._newest_snapshot(instance, source) if request.linked else Success(None)
                )
            )
            return order.bind(partial(self._clone_maker.clone, instance))

        return run(self._vcenter.session, f"cloning VM {request.source_vm_id!r}", make)

    def _newest_snapshot(self, instance: Any, vm: Any) -> Result[Any, ProviderError]:
        def newest(trees: list[Any]) -> Result[Any, ProviderError]:
            if not trees:
                return Failure(
                    ProviderError.failed_precondition(
                        f"a linked clone shares the disks of a snapshot, and VM {vm._moId!r} has "
                        "none; take one with SnapshotCreate first, or ask for a full clone"
                    )
                )
            return Success(max(trees, key=attrgetter("createTime", "id")).snapshot)

        return snapshot_trees(self._vcenter, instance, vm._moId).bind(newest)


def _guest_metadata(customization: Customization) -> bytes:
    """cloud-init metadata carrying the host name (FQDN when a domain is given)."""
    if not customization.hostname:
        return b""
    name = customization.hostname
    if customization.domain:
        name = f"{name}.{customization.domain}"
    return json.dumps({"local-hostname": name}).encode()
