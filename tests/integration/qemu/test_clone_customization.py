"""Clone with customization on a real libvirtd + QEMU: the clone's own seed, through libvirt's
upload stream, read back through its download stream, and seen by the real test guest booted
as a clone."""

from __future__ import annotations

import hashlib
import json
import os
import xml.etree.ElementTree as ET
from typing import Any

import libvirt
import pytest
from returns.result import Result

from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import (
    CloneRequest,
    Customization,
    ImageSource,
    NetworkAttachment,
    OwnerMark,
    PrepareImageRequest,
    VMImage,
)

from support import ok
from support.guest import SEED, console, guest_image
from support.libvirt import clone_vm, create_vm
from support.qemu import TEST_POOL, TEST_POOL_PATH, QemuHost
from support.seed import downloaded_volume, seed_files, seed_path

OWNER = OwnerMark(provider="tests/qemu-clone-customization")
SOURCE_USER_DATA = b"#cloud-config\nruncmd: [echo source]\n"
CLONE_USER_DATA = b"#cloud-config\nruncmd: [echo clone]\n"
BOOT_SECONDS = 120  # a bound for a loaded 2-core machine, not a speed check


def made(result: Result[Any, ProviderError]) -> str:
    """The new VM's id, whether the backend answers with the id or with its CreatedVM."""
    value = ok(result)
    return value if isinstance(value, str) else str(value.id)


def inactive_xml(conn: Any, vm_id: str) -> ET.Element:
    dom = conn.lookupByUUIDString(vm_id)
    return ET.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))


def test_a_customized_clone_carries_its_own_seed_and_delete_removes_only_it(
    qemu: QemuHost, conn: Any
) -> None:
    request = qemu.request("qemu-seeded", image=qemu.image, user_data=SOURCE_USER_DATA)
    source = made(create_vm(qemu.backend, request, OWNER))
    source_seed = seed_path(inactive_xml(conn, source))
    source_bytes = downloaded_volume(conn, source_seed)
    customization = Customization(
        hostname="db",
        domain="example.org",
        time_zone="Etc/UTC",
        user_data=CLONE_USER_DATA,
        networks=(NetworkAttachment(static_ip="192.0.2.30", prefix=24, dns=("192.0.2.53",)),),
    )
    clone = CloneRequest(
        source_vm_id=source, target_name="qemu-seeded-copy", customization=customization
    )
    target = made(clone_vm(qemu.backend, clone, OWNER))

    root = inactive_xml(conn, target)
    clone_seed = seed_path(root)
    assert clone_seed != source_seed
    assert os.path.dirname(clone_seed) == str(TEST_POOL_PATH)  # beside the clone's disk
    files = seed_files(downloaded_volume(conn, clone_seed))
    assert json.loads(files["meta-data"]) == {
        "instance-id": target,
        "local-hostname": "db.example.org",
    }
    assert files["user-data"] == CLONE_USER_DATA
    (mac,) = [node.get("address") for node in root.iterfind("devices/interface/mac")]
    assert mac not in {node.get("address") for node in inactive_xml(conn, source).iter("mac")}
    assert json.loads(files["network-config"])["ethernets"] == {
        "nic0": {
            "match": {"macaddress": mac},
            "addresses": ["192.0.2.30/24"],
            "nameservers": {"addresses": ["192.0.2.53"]},
        }
    }
    assert b'"timezone": "Etc/UTC"' in files["vendor-data"]

    ok(qemu.backend.lifecycle.delete(target))
    assert os.path.basename(clone_seed) not in os.listdir(TEST_POOL_PATH)
    assert not any(name.startswith("qemu-seeded-copy-") for name in os.listdir(TEST_POOL_PATH))
    assert seed_path(inactive_xml(conn, source)) == source_seed
    assert downloaded_volume(conn, source_seed) == source_bytes


@pytest.mark.timeout(300)
def test_the_real_guest_booted_as_a_clone_reads_the_clones_seed(qemu: QemuHost, conn: Any) -> None:
    prepare = PrepareImageRequest(
        source=ImageSource(path=str(guest_image()), format="qcow2"),
        target_name="clone-guest-base",
        storage_hint=TEST_POOL,
    )
    prepared = ok(qemu.backend.images.prepare_image(prepare))
    image = VMImage(path=prepared.path, format="qcow2")
    request = qemu.request("clone-guest-source", image=image, user_data=SOURCE_USER_DATA)
    source = made(create_vm(qemu.backend, request, OWNER))
    clone = CloneRequest(
        source_vm_id=source,
        target_name="clone-guest",
        linked=True,
        customization=Customization(hostname="guest", user_data=CLONE_USER_DATA),
    )
    target = made(clone_vm(qemu.backend, clone, OWNER))
    meta_data = seed_files(downloaded_volume(conn, seed_path(inactive_xml(conn, target))))[
        "meta-data"
    ]
    ok(qemu.backend.power.power_on(target))
    with console(conn, conn.lookupByUUIDString(target)) as serial:
        seed = serial.wait_for(SEED, BOOT_SECONDS)
    assert seed["user"] == hashlib.sha256(CLONE_USER_DATA).hexdigest(), seed.group(0)
    assert seed["meta"] == hashlib.sha256(meta_data).hexdigest(), seed.group(0)
