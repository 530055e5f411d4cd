"""The libvirt backend on a real libvirtd + QEMU (`qemu:///system`), for the qemu and contract
suites.

Wanted only with PYRIGAUD_TEST_QEMU=1 (the test command sets it after scripts/libvirtd.sh has
started the daemon), so developer runs without root still work: without it, every test that
needs the daemon is still collected, and skipped with `QEMU_NOT_WANTED` as its reason (the
`qemu` marker, or a module in one of `QEMU_FOLDERS`; see tests/conftest.py). Once wanted, an
unreachable daemon fails the test: nothing is skipped.

Everything a test makes lives in one dedicated dir pool, so cleanup is exact: every domain
with a disk in that pool and every volume in it goes, before a test (a crashed run leaves
nothing that breaks the next) and after it. Guests use user-mode NICs only and get
`<domain type='qemu'>`: KVM is advertised on these machines but does not work.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import libvirt
import pytest

from pyrigaud.adapters.hypervisors.libvirt.connection import (
    LibvirtConnection,
    VirConnect,
    prepare_libvirt_for_process,
)
from pyrigaud.adapters.hypervisors.libvirt.metadata import NAMESPACE_URI
from pyrigaud.adapters.hypervisors.libvirt.storage import PoolSettings, upload_volume, volume_xml
from pyrigaud.application.backend import Backend
from pyrigaud.domain.models import CreateRequest, VMClass, VMImage

from contract.harness import Harness, staging_root
from support import ManualClock, wait_until
from support.libvirt import libvirt_test_backend
from support.qemu_wanted import ENABLE_VARIABLE

QEMU_URI = "qemu:///system"
TEST_POOL = "pyrigaud-test"
# QEMU runs as libvirt-qemu: every directory up to the disks must let it in (0755, not 0700).
TEST_POOL_PATH = Path("/var/lib/pyrigaud-test/pool")
BASE_IMAGE_BYTES = 64 * 1024**2
SESSION_PREFIX = f"base-{secrets.token_hex(4)}"


def open_qemu() -> VirConnect:
    """A raw connection for setup and cleanup; a daemon that does not answer fails the test."""
    prepare_libvirt_for_process()  # libvirt's own stderr printing off
    try:
        return libvirt.open(QEMU_URI)
    except libvirt.libvirtError as error:
        pytest.fail(
            f"{ENABLE_VARIABLE}=1 but libvirtd does not answer on {QEMU_URI} ({error}); "
            "run scripts/libvirtd.sh as root first",
            pytrace=False,
        )


def ensure_test_pool(conn: VirConnect) -> Any:
    """The tests' dir pool, defined and started on first use."""
    return ensure_dir_pool(conn, TEST_POOL, TEST_POOL_PATH)


def ensure_dir_pool(conn: VirConnect, name: str, path: Path) -> Any:
    """A dir pool at `path` (0755 all the way, for QEMU's user), defined and started on first
    use, and refreshed."""
    try:
        pool = conn.storagePoolLookupByName(name)
    except libvirt.libvirtError:
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        root = ET.Element("pool", {"type": "dir"})
        ET.SubElement(root, "name").text = name
        target = ET.SubElement(root, "target")
        ET.SubElement(target, "path").text = str(path)
        ET.SubElement(ET.SubElement(target, "permissions"), "mode").text = "0755"
        pool = conn.storagePoolDefineXML(ET.tostring(root, encoding="unicode"), 0)
        pool.build(0)
    if not pool.isActive():
        pool.create(0)
    wait_until(partial(_refreshed, pool), 60, f"a refresh of pool {name} libvirtd accepts")
    return pool


def _refreshed(pool: Any) -> bool:
    """Whether libvirtd refreshed `pool`; False while it refuses because a volume of it is being
    built or opened by another client (a provider a test started, say): a passing state, as
    pool_jobs.py says, that the provider's own refreshes wait out in-process."""
    try:
        pool.refresh(0)
    except libvirt.libvirtError as refused:
        if "asynchronous jobs running" not in str(refused):
            raise
        return False
    return True


def add_base_image(conn: VirConnect) -> str:
    """An empty qcow2 in the test pool, readable by QEMU's user (0644): no guest OS needed."""
    volume = ET.Element("volume")
    ET.SubElement(volume, "name").text = f"{SESSION_PREFIX}.qcow2"
    ET.SubElement(volume, "capacity", {"unit": "bytes"}).text = str(BASE_IMAGE_BYTES)
    ET.SubElement(volume, "allocation").text = "0"
    target = ET.SubElement(volume, "target")
    ET.SubElement(target, "format", {"type": "qcow2"})
    ET.SubElement(ET.SubElement(target, "permissions"), "mode").text = "0644"
    xml = ET.tostring(volume, encoding="unicode")
    return str(ensure_test_pool(conn).createXML(xml, 0).path())


# Snapshot metadata and a UEFI guest's NVRAM: without them libvirt refuses to undefine.
EVERYTHING_OF_THE_DOMAIN = (
    libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA | libvirt.VIR_DOMAIN_UNDEFINE_NVRAM
)


def remove_test_leftovers(conn: VirConnect) -> list[str]:
    """Every domain using the test pool and every volume in it, gone; returns the names."""
    return remove_pool_leftovers(conn, TEST_POOL, TEST_POOL_PATH)


def random_base_volume(
    conn: VirConnect, pool: str, pool_path: Path, name: str, size_bytes: int
) -> tuple[str, bytes]:
    """A raw volume `name` of random bytes in the pool (made if missing): its path and the
    bytes, for a disk whose transfers are compared byte by byte."""
    content = os.urandom(size_bytes)
    made = ensure_dir_pool(conn, pool, pool_path).createXML(
        volume_xml(name, size_bytes, volume_format="raw"), 0
    )
    mib = 2**20
    upload_volume(conn, made, (content[at : at + mib] for at in range(0, size_bytes, mib)))
    return str(made.path()), content


def swept_pool_connection(name: str, path: Path) -> Iterator[VirConnect]:
    """A raw connection for a module's own pool, swept of leftovers before and after (a
    fixture's body: `yield from swept_pool_connection(POOL, POOL_PATH)`)."""
    connection = open_qemu()
    remove_pool_leftovers(connection, name, path)
    yield connection
    remove_pool_leftovers(connection, name, path)
    connection.close()


def remove_pool_leftovers(conn: VirConnect, name: str, path: Path) -> list[str]:
    """Every domain using the pool at `path` and every volume in it, gone; returns the names.

    A domain uses the pool when one of its disks, or a volume its pyrigaud metadata records
    (a Create's building placeholder has no disks yet), lies there.
    """
    removed: list[str] = []
    prefix = f"{path}/"
    for dom in conn.listAllDomains(0):
        with contextlib.suppress(libvirt.libvirtError):  # another suite removed it meanwhile
            if any(used.startswith(prefix) for used in _paths_in_use(dom)):
                removed.append(str(dom.name()))
                if dom.isActive():
                    dom.destroy()
                dom.undefineFlags(EVERYTHING_OF_THE_DOMAIN)
    for volume in ensure_dir_pool(conn, name, path).listAllVolumes(0):
        removed.append(str(volume.name()))
        volume.delete(0)
    return removed


def disk_sources(dom: Any) -> list[str]:
    root = ET.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    return [source.get("file", "") for source in root.iterfind("devices/disk/source")]


def _paths_in_use(dom: Any) -> list[str]:
    root = ET.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    disks = [source.get("file", "") for source in root.iterfind("devices/disk/source")]
    recorded = root.iterfind(f"metadata/{{{NAMESPACE_URI}}}vm/{{{NAMESPACE_URI}}}volumes/*")
    return disks + [volume.get("path", "") for volume in recorded]


@dataclass
class QemuHost:
    """The libvirt backend on qemu:///system, and a base image to create VMs from."""

    backend: Backend
    clock: ManualClock
    image: VMImage
    staging_root: Path  # the backend's PVC root (contract.harness.STAGING_PVC mounted)

    def request(self, name: str, **changes: object) -> CreateRequest:
        """A small blank VM, changed by `changes`."""
        base = CreateRequest(name=name, vm_class=VMClass(cpu=1, memory_mib=256), image=VMImage())
        return base.model_copy(update=changes)


def qemu_host() -> Iterator[QemuHost]:
    """The backend on qemu:///system and a base image; everything made is removed after."""
    conn = open_qemu()
    try:
        remove_test_leftovers(conn)
        image = VMImage(path=add_base_image(conn), format="qcow2")
        clock = ManualClock()
        connection = LibvirtConnection(QEMU_URI)
        with tempfile.TemporaryDirectory(prefix="pyrigaud-pvc-") as directory:
            root = staging_root(Path(directory))
            backend = libvirt_test_backend(
                connection,
                clock,
                domain_type="qemu",
                pools=PoolSettings(default_pool=TEST_POOL, default_pool_path=str(TEST_POOL_PATH)),
            )
            try:
                yield QemuHost(backend=backend, clock=clock, image=image, staging_root=root)
            finally:
                connection.close()
                remove_test_leftovers(conn)
    finally:
        conn.close()


def qemu_harness() -> Iterator[Harness]:
    """`qemu_host` for the contract suite (running VMs there have no guest OS to report)."""
    for host in qemu_host():
        yield Harness(
            backend=host.backend,
            clock=host.clock,
            image=host.image,
            guest_reports_addresses=False,
            staging_root=host.staging_root,
        )


def qemu_img_info(path: str) -> dict[str, Any]:
    """What qemu-img reads of an image, even one a running VM holds."""
    shown = subprocess.run(
        ["qemu-img", "info", "-U", "--output=json", path], check=True, capture_output=True
    )
    info: dict[str, Any] = json.loads(shown.stdout)
    return info
