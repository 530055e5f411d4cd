"""Network attachments as device changes: the template's NICs are replaced, not appended to."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pyVmomi import vim as untyped_vim
from returns.iterables import Fold
from returns.result import Failure, Result, Success

from pyrigaud.adapters.hypervisors.vsphere.device_models import NIC_CLASSES
from pyrigaud.adapters.hypervisors.vsphere.properties import retrieve, retrieve_all
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import NetworkAttachment

# pyVmomi's stubs leave its data-object constructors untyped: use them dynamically.
vim: Any = untyped_vim

NIC_MODELS: dict[str, Any] = {
    "": vim.vm.device.VirtualVmxnet3,
    **{str(model): kind for model, kind in NIC_CLASSES.items()},
}


@dataclass(frozen=True)
class AttachmentFields:
    """Where the request holds its network attachments (Create's networks, Clone's
    customization.networks), so that an error names the attachment's field."""

    field: Callable[[int, str], str]  # (index, NetworkAttachment attribute) -> the domain path

    def name(self, index: int, attribute: str) -> str:
        return self.field(index, attribute)


CREATE_ATTACHMENTS = AttachmentFields(fields.network_field)
CLONE_ATTACHMENTS = AttachmentFields(fields.customize_network_field)


def nic_changes(
    instance: Any,
    devices: Sequence[Any],
    attachments: Sequence[NetworkAttachment],
    named: AttachmentFields,
) -> Result[list[Any], ProviderError]:
    """Remove every existing NIC and add one per attachment (nothing when none are asked)."""
    if not attachments:
        return Success([])
    networks = {
        str(row.get("name")): row["_ref"] for row in retrieve_all(instance, vim.Network, ("name",))
    }
    removals = [
        vim.vm.device.VirtualDeviceSpec(operation="remove", device=device)
        for device in devices
        if isinstance(device, vim.vm.device.VirtualEthernetCard)
    ]
    additions: Result[tuple[Any, ...], ProviderError] = Fold.collect(
        (
            _new_nic(instance, networks, attachment, index, named)
            for index, attachment in enumerate(attachments)
        ),
        Success(()),
    )

    def changes(added: tuple[Any, ...]) -> list[Any]:
        return removals + list(added)

    return additions.map(changes)


def _new_nic(
    instance: Any,
    networks: dict[str, Any],
    attachment: NetworkAttachment,
    index: int,
    named: AttachmentFields,
) -> Result[Any, ProviderError]:
    given = [key for key in ("portgroup", "network_name", "name") if getattr(attachment, key)]
    source = given[0] if given else "portgroup"
    name = str(getattr(attachment, source))
    if name not in networks:
        return Failure(
            ProviderError.invalid_spec(named.name(index, source), f"no network {name!r}")
        )
    model = NIC_MODELS.get(attachment.model.lower())
    if model is None:
        known = ", ".join(sorted(key for key in NIC_MODELS if key))
        return Failure(
            ProviderError.invalid_spec(
                named.name(index, "model"), f"one of {known}, got {attachment.model!r}"
            )
        )
    nic = model(key=-200 - index, backing=_backing(instance, networks[name], name))
    nic.connectable = vim.vm.device.VirtualDevice.ConnectInfo(
        startConnected=True, allowGuestControl=True, connected=False
    )
    if attachment.mac_address:
        nic.addressType = "manual"
        nic.macAddress = attachment.mac_address
    else:
        nic.addressType = "generated"
    return Success(vim.vm.device.VirtualDeviceSpec(operation="add", device=nic))


def _backing(instance: Any, network: Any, name: str) -> Any:
    if isinstance(network, vim.dvs.DistributedVirtualPortgroup):
        row = retrieve(instance, [network], ("key", "config.distributedVirtualSwitch"))[0]
        switch = retrieve(instance, [row["config.distributedVirtualSwitch"]], ("uuid",))[0]
        port = vim.dvs.PortConnection(portgroupKey=row["key"], switchUuid=switch["uuid"])
        return vim.vm.device.VirtualEthernetCard.DistributedVirtualPortBackingInfo(port=port)
    return vim.vm.device.VirtualEthernetCard.NetworkBackingInfo(network=network, deviceName=name)
