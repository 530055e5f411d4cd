"""A real guest for the end-to-end tests: the image scripts/guest_image.sh builds, the
markers it prints on its serial console, and commands run in it through its guest agent.

Besides the default guest, the script builds hardware variants: guests born on one hardware
set, whose initramfs holds only that set's storage and NIC drivers (no agent). `HARDWARE` maps
each variant to that set in libvirt's terms; a variant prints which drivers reached its disk
and its network (`DISK`, `NET`), or `none` on hardware it has no driver for.

The guest keeps repeating its markers (see the script), so a console opened after boot still
sees them. Commands through the agent run in the guest's initramfs (its RAM), which is what
makes them a witness of memory state.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import re
import subprocess
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import libvirt
import libvirt_qemu

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "guest_image.sh"
BUILD_SECONDS = 600  # a first build downloads the kernel package
READY = re.compile(r"PYRIGAUD-GUEST-READY uptime=(?P<uptime>[0-9.]+)s")
SEED = re.compile(
    r"PYRIGAUD-SEED (?:user-data-sha256=(?P<user>\w+) meta-data-sha256=(?P<meta>\w+)|none)"
)
POWEROFF = re.compile(r"PYRIGAUD-POWEROFF via=(?P<via>\w+)")
# A hardware variant's: the module of the controller (or virtio driver) that reached the disk
# carrying its build-time marker, and of the NIC that got a DHCP address.
DISK = re.compile(r"PYRIGAUD-DISK (?:ok driver=(?P<driver>\w+)|none)")
NET = re.compile(r"PYRIGAUD-NET (?:ok ip=(?P<ip>[0-9.]+) driver=(?P<driver>\w+)|none)")
# How long libvirt waits for the agent's answer before "Guest agent not available for now":
# a TCG guest on a loaded two-vCPU host can take more than 10 s to spawn a process.
AGENT_SECONDS = 30


@dataclass(frozen=True)
class Hardware:
    """A hardware set a variant's guest was born on, in libvirt's terms, and the modules its
    guest reaches the disk and the network through."""

    disk_bus: str  # libvirt's <target bus=...>
    nic_model: str
    disk_driver: str
    nic_driver: str
    scsi_controller: str | None = None  # the controller model, for bus scsi
    # A SAS disk's address: Linux's mptsas attaches no end device without one.
    disk_wwn: str | None = None
    uefi: bool = False

    def devices(self, disk_path: str) -> list[ET.Element]:
        """The disk (a qcow2, booted first), its controller if any, and a user-mode NIC."""
        devices: list[ET.Element] = []
        if self.scsi_controller is not None:
            devices.append(
                ET.Element("controller", type="scsi", index="0", model=self.scsi_controller)
            )
        disk = ET.Element("disk", type="file", device="disk")
        ET.SubElement(disk, "driver", name="qemu", type="qcow2")
        ET.SubElement(disk, "source", file=disk_path)
        prefix = "vd" if self.disk_bus == "virtio" else "sd"
        ET.SubElement(disk, "target", dev=f"{prefix}a", bus=self.disk_bus)
        if self.disk_wwn is not None:
            ET.SubElement(disk, "wwn").text = self.disk_wwn
        ET.SubElement(disk, "boot", order="1")
        nic = ET.Element("interface", type="user")
        ET.SubElement(nic, "model", type=self.nic_model)
        return [*devices, disk, nic]

    def devices_xml(self, disk_path: str) -> str:
        """`devices` as the text to put in a domain's <devices>."""
        return "".join(
            ET.tostring(device, encoding="unicode") for device in self.devices(disk_path)
        )

    def domain_xml(self, name: str, disk_path: str, memory_mib: int = 256) -> str:
        """A whole software-emulated domain on this hardware, its serial line a console."""
        domain = ET.Element("domain", type="qemu")
        ET.SubElement(domain, "name").text = name
        ET.SubElement(domain, "memory", unit="MiB").text = str(memory_mib)
        ET.SubElement(domain, "vcpu").text = "1"
        boot = ET.SubElement(domain, "os", {"firmware": "efi"} if self.uefi else {})
        ET.SubElement(boot, "type", arch="x86_64").text = "hvm"
        ET.SubElement(ET.SubElement(domain, "features"), "acpi")
        devices = ET.SubElement(domain, "devices")
        devices.extend(self.devices(disk_path))
        ET.SubElement(devices, "serial", type="pty")
        ET.SubElement(devices, "console", type="pty")
        return ET.tostring(domain, encoding="unicode")


HARDWARE = {
    "pvscsi": Hardware("scsi", "vmxnet3", "vmw_pvscsi", "vmxnet3", scsi_controller="vmpvscsi"),
    "lsisas": Hardware(
        "scsi",
        "e1000e",
        "mptsas",
        "e1000e",
        scsi_controller="lsisas1068",
        disk_wwn="0x5000000000000001",
    ),
    "ahci": Hardware("sata", "e1000", "ahci", "e1000"),
    "virtio": Hardware("virtio", "virtio", "virtio_blk", "virtio_net"),
    "uefi": Hardware("virtio", "virtio", "virtio_blk", "virtio_net", uefi=True),
}


@functools.cache
def guest_image(variant: str = "default") -> Path:
    """The cached image of the default guest or of a `HARDWARE` variant (built on first use;
    needs root then); a failed build fails the test."""
    built = subprocess.run(
        [str(SCRIPT), variant], capture_output=True, text=True, timeout=BUILD_SECONDS, check=False
    )
    if built.returncode != 0:
        raise AssertionError(f"{SCRIPT.name} failed ({built.returncode}): {built.stderr[-4000:]}")
    image = Path(built.stdout.strip().splitlines()[-1])
    assert image.is_file(), f"{SCRIPT.name} printed {image}, which is not a file"
    return image


class Console:
    """A domain's serial console read through libvirt (virDomainOpenConsole), all text kept.

    Needs libvirt's event loop running in this process (support.qemu.open_qemu starts it):
    the stream is non-blocking and the loop moves its bytes."""

    def __init__(self, conn: Any, dom: Any) -> None:
        self._stream = conn.newStream(libvirt.VIR_STREAM_NONBLOCK)
        dom.openConsole(None, self._stream, libvirt.VIR_DOMAIN_CONSOLE_FORCE)
        self._text = ""
        self._closed = False

    @property
    def text(self) -> str:
        self._drain()
        return self._text

    def wait_for(self, pattern: re.Pattern[str], seconds: float, after: int = 0) -> re.Match[str]:
        """The first match at or past offset `after`; fails with the console's tail if none
        shows up in time (a bound on a wait, not a speed check)."""
        deadline = time.monotonic() + seconds
        while True:
            self._drain()
            found = pattern.search(self._text, after)
            if found is not None:
                return found
            if self._closed or time.monotonic() > deadline:
                raise AssertionError(
                    f"no {pattern.pattern!r} on the console in {seconds} s; "
                    f"it ends with: {self._text[-2000:]!r}"
                )
            time.sleep(0.2)

    def close(self) -> None:
        if not self._closed:
            with contextlib.suppress(libvirt.libvirtError):  # the guest is gone already
                self._stream.finish()
            self._closed = True

    def _drain(self) -> None:
        while not self._closed:
            try:
                data = self._stream.recv(65536)
            except libvirt.libvirtError:
                self._closed = True  # the domain stopped: the stream ends with an error
                return
            if data == -2:  # nothing more for now
                return
            if not data:
                self._closed = True
                return
            self._text += data.decode(errors="replace")


@contextlib.contextmanager
def console(conn: Any, dom: Any) -> Iterator[Console]:
    opened = Console(conn, dom)
    try:
        yield opened
    finally:
        opened.close()


@dataclass(frozen=True)
class Exited:
    code: int
    out: str


def guest_exec(dom: Any, *argv: str) -> Exited:
    """Run a command in the guest through qemu-guest-agent and wait (bounded) for its end."""
    started = _agent(
        dom, "guest-exec", path=argv[0], arg=list(argv[1:]), **{"capture-output": True}
    )
    deadline = time.monotonic() + AGENT_SECONDS
    while True:
        status = _agent(dom, "guest-exec-status", pid=started["pid"])
        if status["exited"]:
            out = base64.b64decode(status.get("out-data", "")).decode(errors="replace")
            return Exited(code=int(status.get("exitcode", -1)), out=out)
        assert time.monotonic() < deadline, f"{argv} still running after {AGENT_SECONDS} s"
        time.sleep(0.1)


def guest_spawn(dom: Any, *argv: str) -> None:
    """Start a command in the guest without waiting for it (one that stops the agent)."""
    _agent(dom, "guest-exec", path=argv[0], arg=list(argv[1:]))


def wait_for_agent_gone(dom: Any, seconds: float) -> None:
    """Until libvirt stops reaching the agent (it sees the guest close its port)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            _agent(dom, "guest-ping")
        except libvirt.libvirtError:
            return
        assert time.monotonic() < deadline, f"the guest agent still answers after {seconds} s"
        time.sleep(0.5)


def wait_for_agent(dom: Any, seconds: float) -> None:
    """Until the agent answers (it starts late in boot and resynchronises after a revert)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            _agent(dom, "guest-ping")
            return
        except libvirt.libvirtError as error:
            if time.monotonic() > deadline:
                raise AssertionError(f"the guest agent did not answer in {seconds} s") from error
            time.sleep(0.5)


def _agent(dom: Any, command: str, **arguments: object) -> Any:
    request = json.dumps({"execute": command, **({"arguments": arguments} if arguments else {})})
    return json.loads(libvirt_qemu.qemuAgentCommand(dom, request, AGENT_SECONDS, 0))["return"]


def shutoff_reason(dom: Any) -> int:
    """Why a stopped domain stopped: VIR_DOMAIN_SHUTOFF_SHUTDOWN when the guest did it."""
    state, reason = dom.state(0)
    assert state == libvirt.VIR_DOMAIN_SHUTOFF, f"domain state {state}, not shut off"
    return int(reason)


def pool_volume_names(pool: Any) -> set[str]:
    pool.refresh(0)
    return {str(volume.name()) for volume in pool.listAllVolumes(0)}
