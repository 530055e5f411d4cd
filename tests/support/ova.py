"""Tiny OVA packages for the vSphere image tests, and the simulator's datastore files.

An OVA is a tar of a one-disk OVF descriptor and a streamOptimized vmdk made by qemu-img (the
form vCenter imports); the simulator's datastore HTTP file access reads a file back byte for
byte, so a test compares what reached the datastore with what it sent.
"""

from __future__ import annotations

import io
import ssl
import subprocess
import tarfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import quote

from support.image_server import raw_image
from support.vsphere import Simulator

DATACENTER = "DC0"
DATASTORE = "LocalDS_0"

OVF_TEMPLATE = """<?xml version="1.0" encoding="UTF-8"?>
<Envelope xmlns="http://schemas.dmtf.org/ovf/envelope/1"
    xmlns:ovf="http://schemas.dmtf.org/ovf/envelope/1"
    xmlns:rasd="http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_ResourceAllocationSettingData"
    xmlns:vssd="http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_VirtualSystemSettingData">
  <References>
    <File ovf:id="file1" ovf:href="{disk}" ovf:size="{size}"/>
  </References>
  <DiskSection>
    <Info>Virtual disks</Info>
    <Disk ovf:diskId="vmdisk1" ovf:fileRef="file1" ovf:capacity="{capacity}"
        ovf:format="http://www.vmware.com/interfaces/specifications/vmdk.html#streamOptimized"/>
  </DiskSection>
  <VirtualSystem ovf:id="tiny">
    <Info>A one-disk test VM</Info>
    <Name>tiny</Name>
    <OperatingSystemSection ovf:id="101">
      <Info>Linux</Info>
    </OperatingSystemSection>
    <VirtualHardwareSection>
      <Info>Hardware</Info>
      <System>
        <vssd:ElementName>Virtual Hardware Family</vssd:ElementName>
        <vssd:InstanceID>0</vssd:InstanceID>
        <vssd:VirtualSystemIdentifier>tiny</vssd:VirtualSystemIdentifier>
        <vssd:VirtualSystemType>vmx-13</vssd:VirtualSystemType>
      </System>
      <Item>
        <rasd:AllocationUnits>hertz * 10^6</rasd:AllocationUnits>
        <rasd:ElementName>1 virtual CPU</rasd:ElementName>
        <rasd:InstanceID>1</rasd:InstanceID>
        <rasd:ResourceType>3</rasd:ResourceType>
        <rasd:VirtualQuantity>1</rasd:VirtualQuantity>
      </Item>
      <Item>
        <rasd:AllocationUnits>byte * 2^20</rasd:AllocationUnits>
        <rasd:ElementName>256MB of memory</rasd:ElementName>
        <rasd:InstanceID>2</rasd:InstanceID>
        <rasd:ResourceType>4</rasd:ResourceType>
        <rasd:VirtualQuantity>256</rasd:VirtualQuantity>
      </Item>
      <Item>
        <rasd:Address>0</rasd:Address>
        <rasd:ElementName>SCSI controller 0</rasd:ElementName>
        <rasd:InstanceID>3</rasd:InstanceID>
        <rasd:ResourceSubType>lsilogic</rasd:ResourceSubType>
        <rasd:ResourceType>6</rasd:ResourceType>
      </Item>
      <Item>
        <rasd:AddressOnParent>0</rasd:AddressOnParent>
        <rasd:ElementName>Hard disk 1</rasd:ElementName>
        <rasd:HostResource>ovf:/disk/vmdisk1</rasd:HostResource>
        <rasd:InstanceID>4</rasd:InstanceID>
        <rasd:Parent>3</rasd:Parent>
        <rasd:ResourceType>17</rasd:ResourceType>
      </Item>
    </VirtualHardwareSection>
  </VirtualSystem>
</Envelope>
"""


def stream_optimized_vmdk(raw: bytes, workdir: Path) -> bytes:
    """The raw disk as the streamOptimized vmdk vCenter imports (made by qemu-img)."""
    source, target = workdir / "disk.raw", workdir / "disk.vmdk"
    source.write_bytes(raw)
    subprocess.run(
        [
            *("qemu-img", "convert", "-f", "raw", "-O", "vmdk", "-o", "subformat=streamOptimized"),
            *(str(source), str(target)),
        ],
        check=True,
    )
    return target.read_bytes()


def ovf_descriptor(vmdk: bytes, capacity: int, disk_name: str = "tiny-disk1.vmdk") -> bytes:
    return OVF_TEMPLATE.format(disk=disk_name, size=len(vmdk), capacity=capacity).encode()


def ova_of(descriptor: bytes, vmdk: bytes, disk_name: str = "tiny-disk1.vmdk") -> bytes:
    """The tar an OVA is: the descriptor first, then the disk."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in (("tiny.ovf", descriptor), (disk_name, vmdk)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def tiny_disk(workdir: Path) -> tuple[bytes, bytes]:
    """(raw, streamOptimized vmdk) of a 1 MiB disk whose every block is numbered."""
    raw = raw_image(1024 * 1024)
    return raw, stream_optimized_vmdk(raw, workdir)


def datastore_url(simulator: Simulator, datastore_path: str) -> str:
    """The HTTP file access URL of "[datastore] dir/file"."""
    datastore, _, path = datastore_path.partition("] ")
    origin = simulator.endpoint.removesuffix("/sdk")
    return (
        f"{origin}/folder/{quote(path)}?dcPath={DATACENTER}&dsName={quote(datastore.lstrip('['))}"
    )


def _unverified() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def read_datastore_file(simulator: Simulator, instance: Any, datastore_path: str) -> bytes:
    """The file's bytes, read through the datastore's HTTP file access (as vCenter serves)."""
    request = urllib.request.Request(
        datastore_url(simulator, datastore_path), headers={"Cookie": instance._stub.cookie}
    )
    with urllib.request.urlopen(request, context=_unverified(), timeout=30) as response:
        return bytes(response.read())


def write_datastore_file(
    simulator: Simulator, instance: Any, datastore_path: str, data: bytes
) -> None:
    request = urllib.request.Request(
        datastore_url(simulator, datastore_path),
        data=data,
        method="PUT",
        headers={"Cookie": instance._stub.cookie},
    )
    with urllib.request.urlopen(request, context=_unverified(), timeout=30) as response:
        assert response.status in (200, 201)


def datastore_file_exists(simulator: Simulator, instance: Any, datastore_path: str) -> bool:
    try:
        read_datastore_file(simulator, instance, datastore_path)
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return False
        raise
    return True
