"""Network attachments as device changes: the template's NICs are replaced, not appended to."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyVmomi import vim as untyped_vim

from pyrigaud.adapters.hypervisors.vsphere.errors import AdapterError
from pyrigaud.adapters.hypervisors.vsphere.inventory import retrieve, retrieve_all
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import NetworkAttachment

# pyVmomi's stubs leave its data-object constructors untyped: use them dynamically.
vim: Any = untyped_vim

NIC_MODELS: dict[str, Any] = {
    "": vim.vm.device.VirtualVmxnet3,
    "vmxnet3": vim.vm.device.VirtualVmxnet3,
    "e1000": vim.vm.device.VirtualE1000,
    "e1000e": vim.vm.device.VirtualE1000e,
}


def nic_changes(
    instance: Any, devices: Sequence[Any], attachments: Sequence[NetworkAttachment]
) -> list[Any]:
    """Remove every existing NIC and add one per attachment (nothing when none are asked)."""
    if not attachments:
        return []
    networks = {
        str(row.get("name")): row["_ref"] for row in retrieve_all(instance, vim.Network, ("name",))
    }
    removals = [
        vim.vm.device.VirtualDeviceSpec(operation="remove", device=device)
        for device in devices
        if isinstance(device, vim.vm.device.VirtualEthernetCard)
    ]
    additions = [
        _new_nic(instance, networks, attachment, index)
        for index, attachment in enumerate(attachments)
    ]
    return removals + additions


def _new_nic(
    instance: Any, networks: dict[str, Any], attachment: NetworkAttachment, index: int
) -> Any:
    field = f"networks[{index}]"
    name = attachment.portgroup or attachment.network_name or attachment.name
    if name not in networks:
        raise AdapterError(ProviderError.invalid_spec(f"{field}.portgroup", f"no network {name!r}"))
    model = NIC_MODELS.get(attachment.model.lower())
    if model is None:
        known = ", ".join(sorted(key for key in NIC_MODELS if key))
        raise AdapterError(
            ProviderError.invalid_spec(
                f"{field}.model", f"one of {known}, got {attachment.model!r}"
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
    return vim.vm.device.VirtualDeviceSpec(operation="add", device=nic)


def _backing(instance: Any, network: Any, name: str) -> Any:
    if isinstance(network, vim.dvs.DistributedVirtualPortgroup):
        row = retrieve(instance, [network], ("key", "config.distributedVirtualSwitch"))[0]
        switch = retrieve(instance, [row["config.distributedVirtualSwitch"]], ("uuid",))[0]
        port = vim.dvs.PortConnection(portgroupKey=row["key"], switchUuid=switch["uuid"])
        return vim.vm.device.VirtualEthernetCard.DistributedVirtualPortBackingInfo(port=port)
    return vim.vm.device.VirtualEthernetCard.NetworkBackingInfo(network=network, deviceName=name)
