"""Reading a cloud-init NoCloud seed back: its files, from the ISO bytes or a libvirt volume."""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET
from typing import Any

import pycdlib

SEED_FILES = ("user-data", "meta-data", "network-config", "vendor-data")


def seed_files(iso_bytes: bytes) -> dict[str, bytes]:
    """Each seed file the ISO holds, by its Rock Ridge name."""
    iso = pycdlib.PyCdlib()
    iso.open_fp(io.BytesIO(iso_bytes))
    try:
        files = {}
        for name in SEED_FILES:
            out = io.BytesIO()
            try:
                iso.get_file_from_iso_fp(out, rr_path=f"/{name}")
            except pycdlib.pycdlibexception.PyCdlibInvalidInput:
                continue  # not in this seed
            files[name] = out.getvalue()
        return files
    finally:
        iso.close()


def downloaded_volume(conn: Any, path: str) -> bytes:
    """A volume's bytes through libvirt's download stream, as a remote host would give them."""
    volume = conn.storageVolLookupByPath(path)
    stream = conn.newStream(0)
    chunks: list[bytes] = []
    volume.download(stream, 0, 0, 0)
    stream.recvAll(lambda _stream, data, _opaque: chunks.append(data), None)
    stream.finish()
    return b"".join(chunks)


def seed_path(domain_xml: ET.Element) -> str:
    """The file behind the domain's one cdrom (the seed)."""
    (source,) = domain_xml.findall("devices/disk[@device='cdrom']/source")
    return source.get("file", "")
