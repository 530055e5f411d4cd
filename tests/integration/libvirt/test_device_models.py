"""The nearest libvirt devices for a migrated guest's hardware, and the domain's words for a
domain's devices: the mapping alone, without a hypervisor."""

from __future__ import annotations

import logging

import pytest

from pyrigaud.adapters.hypervisors.libvirt.device_models import (
    DISK_CONTROLLER_DEVICE,
    NATIVE,
    NIC_DEVICE,
    Fallback,
    FallbackCounts,
    disk_controller_of,
    nearest_devices,
    nic_model_of,
    shown_disk_controller,
)
from pyrigaud.adapters.hypervisors.libvirt.domain_xml import DiskDevice
from pyrigaud.domain.hardware import DiskController, NicModel, VirtualHardware
from pyrigaud.domain.models import NetworkAttachment


def born_on(
    controller: DiskController | None,
    *nics: NicModel | None,
    source: str = "vsphere",
) -> VirtualHardware:
    return VirtualHardware(source_hypervisor=source, disk_controller=controller, nic_models=nics)


def test_nothing_known_keeps_libvirts_own_devices() -> None:
    devices = nearest_devices(None, has_ide=True)
    assert devices == NATIVE
    assert (devices.disk_bus, devices.scsi_controller, devices.nic_model(0)) == (
        "virtio",
        "",
        "virtio",
    )


@pytest.mark.parametrize(
    ("controller", "bus", "model"),
    [
        (DiskController.PVSCSI, "scsi", "vmpvscsi"),
        (DiskController.LSI_LOGIC_SAS, "scsi", "lsisas1068"),
        (DiskController.SATA, "sata", ""),
        (DiskController.IDE, "ide", ""),
        (DiskController.VIRTIO_BLK, "virtio", ""),
        (DiskController.VIRTIO_SCSI, "scsi", "virtio-scsi"),
    ],
)
def test_a_controller_qemu_emulates_is_given_as_it_was(
    controller: DiskController, bus: str, model: str
) -> None:
    devices = nearest_devices(born_on(controller), has_ide=True)
    assert (devices.disk_bus, devices.scsi_controller, devices.fallbacks) == (bus, model, ())


@pytest.mark.parametrize(
    ("controller", "has_ide", "bus", "model"),
    [
        (DiskController.LSI_LOGIC, True, "scsi", "lsisas1068"),
        (DiskController.BUSLOGIC, True, "ide", ""),
        (DiskController.BUSLOGIC, False, "sata", ""),
        (DiskController.IDE, False, "sata", ""),  # q35 has no IDE controller
        (DiskController.NVME, True, "sata", ""),  # this libvirt has no NVMe disk bus
        (None, True, "sata", ""),
    ],
)
def test_a_controller_without_an_equivalent_is_a_counted_fallback(
    controller: DiskController | None, has_ide: bool, bus: str, model: str
) -> None:
    devices = nearest_devices(born_on(controller), has_ide=has_ide)
    assert (devices.disk_bus, devices.scsi_controller) == (bus, model)
    [fallback] = devices.fallbacks
    assert fallback.device == DISK_CONTROLLER_DEVICE
    assert fallback.guest_had == (controller.value if controller else "a device of unknown model")


def test_qemus_own_lsi_comes_back_as_itself_from_libvirt() -> None:
    devices = nearest_devices(born_on(DiskController.LSI_LOGIC, source="libvirt"), has_ide=True)
    assert (devices.disk_bus, devices.scsi_controller, devices.fallbacks) == (
        "scsi",
        "lsilogic",
        (),
    )


def test_nics_keep_their_model_where_qemu_has_it_and_get_e1000_where_not() -> None:
    hardware = born_on(
        DiskController.PVSCSI,
        NicModel.VMXNET3,
        NicModel.E1000,
        NicModel.E1000E,
        NicModel.RTL8139,
        NicModel.PCNET,
        NicModel.VIRTIO,
        NicModel.VMXNET2,
        None,
    )
    devices = nearest_devices(hardware, has_ide=True)
    assert devices.nic_models == (
        "vmxnet3",
        "e1000",
        "e1000e",
        "rtl8139",
        "pcnet",
        "virtio",
        "e1000",
        "e1000",
    )
    assert devices.fallbacks == (
        Fallback(NIC_DEVICE, "vmxnet2", "e1000", 6),
        Fallback(NIC_DEVICE, "a device of unknown model", "e1000", 7),
    )


def test_a_nic_the_guest_never_had_gets_the_model_of_its_first() -> None:
    devices = nearest_devices(born_on(DiskController.SATA, NicModel.VMXNET3), has_ide=True)
    assert (devices.nic_model(0), devices.nic_model(1)) == ("vmxnet3", "vmxnet3")
    assert nearest_devices(born_on(DiskController.SATA), has_ide=True).nic_model(0) == "e1000"


def test_only_the_fallbacks_of_nics_made_from_the_hardware_count() -> None:
    devices = nearest_devices(
        born_on(DiskController.NVME, NicModel.VMXNET2, NicModel.VMXNET2), has_ide=True
    )
    # The first NIC's model is the request's; the guest's second NIC is not made.
    made = devices.fallbacks_made((NetworkAttachment(model="virtio"),))
    assert [fallback.device for fallback in made] == [DISK_CONTROLLER_DEVICE]
    made = devices.fallbacks_made((NetworkAttachment(), NetworkAttachment()))
    assert [fallback.nic for fallback in made] == [-1, 0, 1]


def test_a_fallback_is_logged_and_counted_by_device(caplog: pytest.LogCaptureFixture) -> None:
    counted: list[str] = []
    counts = FallbackCounts(
        disk_controller=lambda: counted.append(DISK_CONTROLLER_DEVICE),
        nic=lambda: counted.append(NIC_DEVICE),
    )
    fallbacks = nearest_devices(
        born_on(DiskController.LSI_LOGIC, NicModel.VMXNET2), has_ide=True
    ).fallbacks
    with caplog.at_level(logging.WARNING):
        counts.report("migrated", fallbacks)
    assert counted == [DISK_CONTROLLER_DEVICE, NIC_DEVICE]
    warnings = [record.getMessage() for record in caplog.records]
    assert "lsilogic" in warnings[0]
    assert "scsi (lsisas1068)" in warnings[0]
    assert "vmxnet2" in warnings[1]
    assert "e1000" in warnings[1]
    assert all("migrated" in warning for warning in warnings)


@pytest.mark.parametrize(
    ("bus", "controller", "word"),
    [
        ("virtio", "", DiskController.VIRTIO_BLK),
        ("scsi", "vmpvscsi", DiskController.PVSCSI),
        ("scsi", "lsisas1068", DiskController.LSI_LOGIC_SAS),
        ("scsi", "lsilogic", DiskController.LSI_LOGIC),
        ("scsi", "virtio-scsi", DiskController.VIRTIO_SCSI),
        ("sata", "", DiskController.SATA),
        ("ide", "", DiskController.IDE),
        ("scsi", "megasas", None),
        ("usb", "", None),
    ],
)
def test_a_disks_controller_in_the_domains_words(
    bus: str, controller: str, word: DiskController | None
) -> None:
    disk = DiskDevice("/pool/disk.qcow2", "qcow2", "sda", bus=bus, controller=controller)
    assert disk_controller_of(disk) is word


def test_describe_names_a_controller_without_a_word_in_libvirts_own() -> None:
    megasas = DiskDevice("/pool/disk.qcow2", "qcow2", "sda", bus="scsi", controller="megasas")
    assert shown_disk_controller(megasas) == "scsi/megasas"
    assert shown_disk_controller(DiskDevice("/p", "raw", "sda", bus="usb")) == "usb"


def test_a_nic_model_in_the_domains_words() -> None:
    assert nic_model_of("virtio-transitional") is NicModel.VIRTIO
    assert nic_model_of("pcnet") is NicModel.PCNET
    assert nic_model_of("ne2k_pci") is None
