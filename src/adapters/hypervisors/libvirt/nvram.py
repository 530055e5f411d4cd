"""A UEFI VM's NVRAM (its firmware variables) copied aside and put back, through libvirt's
storage API, so it works over every transport and nothing runs on the host.

The NVRAM is a file libvirt keeps outside any pool (`/var/lib/libvirt/qemu/nvram/<name>_VARS.fd`
on a system daemon, the path the running domain's `<os><nvram>` names). To read and replace
it as a volume, its directory is reached through the pool that already covers it (started if
it was not), else a transient dir pool pyrigaud starts over it (`pyrigaud-nvram-<hash>`; it
only lists files, it never changes the directory, ListVMs' listing of disks skips it, and it
is gone when libvirtd restarts, to be started again on the next use). A VM that has never run
has no NVRAM yet: its copy is "none", and putting "none" back removes the file, so the next
boot starts from the firmware's template again, as it did then. QEMU's user regains the
restored file at the next start (libvirt labels it).
"""

from __future__ import annotations

import hashlib
import posixpath
import xml.etree.ElementTree as ET
from functools import partial

import libvirt

from pyrigaud.adapters.hypervisors.libvirt.calls import Refused, answer, or_none
from pyrigaud.adapters.hypervisors.libvirt.connection import VirConnect
from pyrigaud.adapters.hypervisors.libvirt.guest import Guest
from pyrigaud.adapters.hypervisors.libvirt.storage import (
    NVRAM_POOL_PREFIX,
    VirStoragePool,
    VirStorageVol,
    delete_volume,
    volume_xml,
)

# Where a system libvirtd keeps a VM's NVRAM when its definition names none (firmware
# autoselection names it only once the VM runs).
DEFAULT_NVRAM_DIR = "/var/lib/libvirt/qemu/nvram"
# Another replica starting the same transient pool at the same moment.
POOL_RACE_CODES = frozenset(
    {libvirt.VIR_ERR_OPERATION_FAILED, libvirt.VIR_ERR_INTERNAL_ERROR, libvirt.VIR_ERR_DOM_EXIST}
)


def nvram_path(guest: Guest) -> str:
    """The VM's NVRAM file: as the running domain or its definition names it, else where
    libvirt puts it."""
    for flags in (0, libvirt.VIR_DOMAIN_XML_INACTIVE):
        root = ET.fromstring(guest.dom.XMLDesc(flags))  # noqa: S314 - libvirt's own output
        named = root.findtext("os/nvram", "").strip()
        if named:
            return named
    return f"{DEFAULT_NVRAM_DIR}/{guest.name}_VARS.fd"


def copy_nvram(conn: VirConnect, guest: Guest, pool: VirStoragePool, name: str) -> str:
    """The VM's NVRAM copied into `pool` as raw volume `name`; its path, or "" when the VM
    has none yet."""
    source = _nvram_volume(conn, nvram_path(guest))
    if source is None:
        return ""
    size = int(source.info()[1])
    copy = pool.createXMLFrom(volume_xml(name, size, volume_format="raw"), source, 0)
    return str(copy.path())


def restore_nvram(conn: VirConnect, guest: Guest, copy_path: str) -> None:
    """The VM's NVRAM made what `copy_path` holds ("": none, the template's at next boot).
    The VM must be off."""
    path = nvram_path(guest)
    nvram_pool = _pool_over(conn, posixpath.dirname(path))
    current = _volume_in(nvram_pool, posixpath.basename(path))
    if current is not None:
        current.delete(0)
    if not copy_path:
        return
    copy = conn.storageVolLookupByPath(copy_path)
    size = int(copy.info()[1])
    name = posixpath.basename(path)
    nvram_pool.createXMLFrom(volume_xml(name, size, volume_format="raw"), copy, 0)


def forget_nvram_copy(conn: VirConnect, copy_path: str) -> None:
    if copy_path:
        delete_volume(conn, copy_path)


def _nvram_volume(conn: VirConnect, path: str) -> VirStorageVol | None:
    return _volume_in(_pool_over(conn, posixpath.dirname(path)), posixpath.basename(path))


def _volume_in(pool: VirStoragePool, name: str) -> VirStorageVol | None:
    """The volume `name` of `pool` as it is now (the pool is listed afresh first)."""
    pool.refresh(0)
    return or_none(partial(pool.storageVolLookupByName, name))


def _pool_over(conn: VirConnect, directory: str) -> VirStoragePool:
    """An active pool whose target is `directory`: one that covers it already, else the
    transient one pyrigaud starts over it."""
    found = _pool_with_target(conn, directory)
    if found is not None:
        return found
    root = ET.Element("pool", {"type": "dir"})
    digest = hashlib.sha256(directory.encode()).hexdigest()[:12]
    ET.SubElement(root, "name").text = f"{NVRAM_POOL_PREFIX}{digest}"
    ET.SubElement(ET.SubElement(root, "target"), "path").text = directory

    def no_pool_over_it() -> bool:
        return _pool_with_target(conn, directory) is None

    created = answer(
        partial(conn.storagePoolCreateXML, ET.tostring(root, encoding="unicode"), 0),
        POOL_RACE_CODES,
        unless=no_pool_over_it,
    )
    if isinstance(created, Refused):  # another call made the pool over it meanwhile
        return _pool_over(conn, directory)
    return created


def _pool_with_target(conn: VirConnect, directory: str) -> VirStoragePool | None:
    wanted = directory.rstrip("/")
    for pool in conn.listAllStoragePools(0):
        root = ET.fromstring(pool.XMLDesc(0))  # noqa: S314 - libvirt's own output
        if root.findtext("target/path", "").rstrip("/") != wanted:
            continue
        if not pool.isActive():
            pool.create(0)
        return pool
    return None
