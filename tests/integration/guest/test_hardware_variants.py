"""The hardware variants of the test guest boot only where their drivers reach the disk.

Each variant's initramfs holds one hardware set's storage and NIC drivers, as a guest born
there does (scripts/guest_image.sh). Booted on that set through plain libvirt domains (not
through the provider), it reports the driver that reached its disk and its network; booted on
another set, the firmware still loads its kernel but the kernel finds no disk: what a migrated
guest without the target's drivers does.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.guest import DISK, HARDWARE, NET, READY, console, guest_image
from support.qemu import EVERYTHING_OF_THE_DOMAIN, ensure_dir_pool, open_qemu, remove_pool_leftovers

pytestmark = pytest.mark.timeout(900)

# A pool of its own: the guest suites sweep theirs whole while they run.
VARIANT_POOL = "pyrigaud-variants"
VARIANT_POOL_PATH = Path("/var/lib/pyrigaud-test/variants")
# Bounds on waits under software emulation on two busy cores; the guest gives up on its
# disk and network after about a minute of its own, so "none" shows up within these too.
BOOT_SECONDS = 300
REPORT_SECONDS = 240
USER_NETWORK_ADDRESS = "10.0.2.15"  # QEMU's user-mode DHCP hands out this one first


@pytest.fixture(scope="module")
def conn() -> Iterator[Any]:
    connection = open_qemu()
    try:
        remove_pool_leftovers(connection, VARIANT_POOL, VARIANT_POOL_PATH)
        yield connection
    finally:
        remove_pool_leftovers(connection, VARIANT_POOL, VARIANT_POOL_PATH)
        connection.close()


@pytest.fixture(scope="module")
def pool(conn: Any) -> Any:
    return ensure_dir_pool(conn, VARIANT_POOL, VARIANT_POOL_PATH)


def boot_reports(conn: Any, pool: Any, variant: str, hardware: str) -> tuple[str, str]:
    """Boot `variant` on `hardware` (a copy-on-write layer over its image in the pool) and
    return its disk and network markers."""
    name = f"variant-{variant}-on-{hardware}"
    disk = VARIANT_POOL_PATH / f"{name}.qcow2"
    image = guest_image(variant)
    layer = ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(image)]
    subprocess.run([*layer, str(disk)], check=True)
    pool.refresh(0)
    dom = conn.defineXML(HARDWARE[hardware].domain_xml(name, str(disk)))
    try:
        dom.create()
        with console(conn, dom) as serial:
            serial.wait_for(READY, BOOT_SECONDS)
            disk_marker = serial.wait_for(DISK, REPORT_SECONDS).group(0)
            net_marker = serial.wait_for(NET, REPORT_SECONDS).group(0)
        return disk_marker, net_marker
    finally:
        if dom.isActive():
            dom.destroy()
        dom.undefineFlags(EVERYTHING_OF_THE_DOMAIN)


# The variants born on vSphere boot on their own hardware at the end of their travel
# (test_hardware_travels.py); the KVM-born one travels to the simulator, which runs no guest.
@pytest.mark.parametrize("variant", ["virtio"])
def test_a_variant_boots_on_its_own_hardware(conn: Any, pool: Any, variant: str) -> None:
    hardware = HARDWARE[variant]
    disk_marker, net_marker = boot_reports(conn, pool, variant, variant)
    assert disk_marker == f"PYRIGAUD-DISK ok driver={hardware.disk_driver}"
    assert net_marker == f"PYRIGAUD-NET ok ip={USER_NETWORK_ADDRESS} driver={hardware.nic_driver}"


# pvscsi on virtio is test_hardware_travels.py's proof that it can fail.
@pytest.mark.parametrize(("variant", "hardware"), [("virtio", "pvscsi")])
def test_a_variant_on_foreign_hardware_reaches_no_disk(
    conn: Any, pool: Any, variant: str, hardware: str
) -> None:
    assert boot_reports(conn, pool, variant, hardware) == (
        "PYRIGAUD-DISK none",
        "PYRIGAUD-NET none",
    )


def test_the_uefi_variant_has_no_bios_boot_code(tmp_path: Path) -> None:
    """A protective MBR with empty boot code and a GPT holding an EFI system partition."""
    raw = tmp_path / "uefi.raw"
    subprocess.run(
        ["qemu-img", "convert", "-O", "raw", str(guest_image("uefi")), str(raw)], check=True
    )
    with raw.open("rb") as disk:
        mbr = disk.read(512)
        gpt_header = disk.read(512)
        first_entry = disk.read(128)
    assert mbr[:440] == bytes(440)
    assert mbr[450] == 0xEE  # the protective partition's type
    assert mbr[510:512] == b"\x55\xaa"
    assert gpt_header[:8] == b"EFI PART"
    efi_system_partition = bytes.fromhex("28732ac11ff8d211ba4b00a0c93ec93b")  # C12A7328-F81F-...
    assert first_entry[:16] == efi_system_partition
