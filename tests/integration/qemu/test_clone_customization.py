"""Clone with customization on a real libvirtd + QEMU: the clone's own seed, through libvirt's
upload stream, read back through its download stream."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from typing import Any

import libvirt
from returns.result import Result

from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.models import CloneRequest, Customization, NetworkAttachment, OwnerMark

from contract.harness import Harness
from qemu_support import TEST_POOL_PATH
from seed_support import downloaded_volume, seed_files, seed_path
from support import ok

OWNER = OwnerMark(provider="tests/qemu-clone-customization")
SOURCE_USER_DATA = b"#cloud-config\nruncmd: [echo source]\n"
CLONE_USER_DATA = b"#cloud-config\nruncmd: [echo clone]\n"


def made(result: Result[Any, ProviderError]) -> str:
    """The new VM's id, whether the adapter answers with the id or with its CreatedVM."""
    value = ok(result)
    return value if isinstance(value, str) else str(value.id)


def inactive_xml(conn: Any, vm_id: str) -> ET.Element:
    dom = conn.lookupByUUIDString(vm_id)
    return ET.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))


def test_a_customized_clone_carries_its_own_seed_and_delete_removes_only_it(
    qemu: Harness, conn: Any
) -> None:
    request = qemu.request("qemu-seeded", image=qemu.image, user_data=SOURCE_USER_DATA)
    source = made(qemu.adapter.create(request, OWNER))
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
    target = made(qemu.adapter.clone(clone, OWNER))

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

    ok(qemu.adapter.delete(target))
    assert os.path.basename(clone_seed) not in os.listdir(TEST_POOL_PATH)
    assert not any(name.startswith("qemu-seeded-copy-") for name in os.listdir(TEST_POOL_PATH))
    assert seed_path(inactive_xml(conn, source)) == source_seed
    assert downloaded_volume(conn, source_seed) == source_bytes
