"""What pyrigaud remembers about a VM, stored in the domain's own <metadata> element.

The hypervisor is the only state: ownership, tags, the in-flight graceful-shutdown deadline,
the creation time, whether a Create is still building the VM, and the volumes pyrigaud made (or,
while building, is about to make) for the VM all live here, versioned, so any replica (or a
restarted one) reads the same facts.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, replace

from pyrigaud.domain.models import OwnerMark

NAMESPACE_URI = "https://pyrigaud.dev/xmlns/vm/1"
NAMESPACE_PREFIX = "pyrigaud"
SCHEMA_VERSION = 1

ET.register_namespace(NAMESPACE_PREFIX, NAMESPACE_URI)


@dataclass(frozen=True, slots=True)
class VMMetadata:
    owner: OwnerMark | None
    created_at: float
    tags: tuple[str, ...] = ()
    volumes: tuple[str, ...] = ()  # paths of the volumes pyrigaud created for this VM
    shutdown_deadline: int | None = None
    building: bool = False  # set from the first define of a Create until it completes
    version: int = SCHEMA_VERSION

    @property
    def building_since(self) -> float | None:
        return self.created_at if self.building else None

    def with_shutdown_deadline(self, deadline: int | None) -> VMMetadata:
        return replace(self, shutdown_deadline=deadline)

    def with_volume(self, path: str) -> VMMetadata:
        return replace(self, volumes=(*self.volumes, path))

    def with_volumes(self, paths: tuple[str, ...]) -> VMMetadata:
        return replace(self, volumes=paths)

    def finished(self) -> VMMetadata:
        return replace(self, building=False)

    def element(self, *, qualified: bool) -> ET.Element:
        """The <vm> element; `qualified` for embedding in domain XML, plain for setMetadata."""

        def tag(name: str) -> str:
            return f"{{{NAMESPACE_URI}}}{name}" if qualified else name

        root = ET.Element(tag("vm"), {"version": str(self.version)})
        if self.owner is not None:
            ET.SubElement(root, tag("owner"), {"provider": self.owner.provider})
        ET.SubElement(root, tag("created")).text = repr(self.created_at)
        tags = ET.SubElement(root, tag("tags"))
        for value in self.tags:
            ET.SubElement(tags, tag("tag")).text = value
        volumes = ET.SubElement(root, tag("volumes"))
        for path in self.volumes:
            ET.SubElement(volumes, tag("volume"), {"path": path})
        if self.shutdown_deadline is not None:
            ET.SubElement(root, tag("shutdown-deadline")).text = str(self.shutdown_deadline)
        if self.building:
            ET.SubElement(root, tag("building"))
        return root

    def render(self) -> str:
        """The text setMetadata takes: unqualified, libvirt adds the namespace."""
        return ET.tostring(self.element(qualified=False), encoding="unicode")


def parse_metadata(element: ET.Element) -> VMMetadata:
    """Read our <vm> element, whether libvirt handed it back qualified or plain."""

    def local(node: ET.Element) -> str:
        return node.tag.rsplit("}", 1)[-1]

    def child(name: str) -> ET.Element | None:
        return next((node for node in element if local(node) == name), None)

    def children(parent: ET.Element | None, name: str) -> list[ET.Element]:
        return [] if parent is None else [node for node in parent if local(node) == name]

    owner_node = child("owner")
    created = child("created")
    deadline = child("shutdown-deadline")
    return VMMetadata(
        owner=None if owner_node is None else OwnerMark(provider=owner_node.get("provider", "")),
        created_at=float(created.text or 0) if created is not None else 0.0,
        tags=tuple(node.text or "" for node in children(child("tags"), "tag")),
        volumes=tuple(node.get("path", "") for node in children(child("volumes"), "volume")),
        shutdown_deadline=int(deadline.text or 0) if deadline is not None else None,
        building=child("building") is not None,
        version=int(element.get("version", SCHEMA_VERSION)),
    )


def metadata_from_text(text: str) -> VMMetadata:
    return parse_metadata(ET.fromstring(text))  # noqa: S314 - libvirt's own output
