"""LIBVIRT_DOMAIN_TYPE=auto on a host that offers no KVM, tested on a real libvirtd of its own.

The machine's daemon offers KVM, so this test starts a second libvirtd in its own mount and
network namespaces (`unshare`, as root), where /dev/kvm is an empty file: QEMU's probe cannot
use KVM there, so libvirt offers only `qemu` domains, as on a host without KVM. The daemon is
the one scripts/libvirtd.sh starts: the monolithic `libvirtd` where the package ships it, else
the modular `virtqemud` with `virtstoraged` (which virtqemud reaches for the storage calls
through its default socket in /run/libvirt, here the namespace's own tmpfs). Every directory
libvirt keeps configuration, state, caches and logs in is a fresh tmpfs in that namespace; the
daemon's pid file and unix sockets are in a temporary directory outside those mounts, which the
test reaches with `qemu+unix:///system?socket=...`. Mounts made there are private: the test's
mount table never shows them. When the daemon exits, the namespace goes with everything the
daemon made in it; the machine's daemon (qemu:///system, the other tests') keeps its process,
pid file and sockets.

The network namespace keeps the daemon's network drivers away from the machine's interfaces
and firewall; a unix socket is reached through the file system, which both namespaces share.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import libvirt
import pytest

from pyrigaud.adapters.hypervisors.libvirt.connection import (
    LibvirtConnection,
    prepare_libvirt_for_process,
)
from pyrigaud.adapters.hypervisors.libvirt.host_capabilities import domain_type_offered
from pyrigaud.domain.models import CreateRequest, OwnerMark, VMClass

from support import ManualClock, ok
from support.libvirt import create_vm, libvirt_test_backend
from support.qemu import open_qemu

OWNER = OwnerMark(provider="tests/host-without-kvm")
CAPABILITIES_LOGGER = "pyrigaud.adapters.hypervisors.libvirt.host_capabilities"
KVM = Path("/dev/kvm")
# What names the tmpfs mounts, so the test can look for them in its own mount table.
MOUNT_SOURCE = "pyrigaud-no-kvm"
# Where libvirt keeps configuration (an empty one: built-in defaults, and none of the machine
# daemon's pools or domains), state, caches and logs; /var/run/libvirt is /run/libvirt on
# Debian, mounted once.
PRIVATE_DIRECTORIES = tuple(
    dict.fromkeys(
        os.path.realpath(directory)
        for directory in (
            "/etc/libvirt",
            "/run/libvirt",
            "/var/run/libvirt",
            "/var/lib/libvirt",
            "/var/cache/libvirt",
            "/var/log/libvirt",
        )
    )
)
# Runs as root in the new namespaces: private tmpfs mounts, /dev/kvm hidden, the modular
# storage daemon if there is one (in the background; the QEMU daemon needs its socket), then
# the daemon the test talks to (same pid: `unshare` and `exec` start no new process).
LAUNCHER = f"""
set -eu
private=$1; daemon=$2; storage=$3; shift 3
for directory in "$@"; do mount -t tmpfs -o mode=0755 {MOUNT_SOURCE} "$directory"; done
if [ -e {KVM} ]; then mount --bind "$private/no-kvm" {KVM}; fi
if [ -n "$storage" ]; then
    "$storage" --config "$private/storage.conf" &
    tries=600
    until [ -S /run/libvirt/virtstoraged-sock ]; do
        tries=$((tries - 1))
        if [ "$tries" -eq 0 ]; then echo "$storage made no socket" >&2; exit 1; fi
        sleep 0.1
    done
fi
exec "$daemon" --config "$private/daemon.conf" --pid-file "$private/daemon.pid"
"""
UNSHARE = ["unshare", "--mount", "--net", "--propagation", "private"]
START_SECONDS = 60
STOP_SECONDS = 30
# The daemon that offers qemu:///system and the storage daemon beside it ("" when the first
# holds the storage driver itself), as scripts/libvirtd.sh chooses them.
MONOLITHIC = ("libvirtd", "")
MODULAR = ("virtqemud", "virtstoraged")


@dataclass(frozen=True)
class PrivateDaemon:
    uri: str
    mount_namespace: str  # /proc/<pid>/ns/mnt of the daemon, e.g. "mnt:[4026532174]"
    private: Path  # its configuration, pid file and sockets


def daemons_here() -> tuple[str, str]:
    """The monolithic daemon where the package ships it, else the modular ones."""
    if shutil.which(MONOLITHIC[0]) is not None:
        return MONOLITHIC
    if all(shutil.which(daemon) is not None for daemon in MODULAR):
        return MODULAR
    pytest.fail("neither libvirtd nor virtqemud with virtstoraged: run scripts/libvirtd.sh")


def skip_unless_namespaces_permitted(private: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: a mount namespace and a second libvirtd")
    probe = subprocess.run(
        [*UNSHARE, "mount", "-t", "tmpfs", MOUNT_SOURCE, str(private)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if probe.returncode != 0:
        pytest.skip(f"mount and network namespaces are not permitted here: {probe.stderr.strip()}")


def write_configuration(private: Path) -> None:
    """The daemon's sockets in `private`, root's only; the storage daemon's in the namespace's
    /run/libvirt, where virtqemud looks for them; no polkit (none runs here)."""
    sockets = private / "sockets"
    sockets.mkdir(mode=0o700)
    (private / "no-kvm").touch()
    root_only = (
        'unix_sock_rw_perms = "0700"\n'
        'unix_sock_ro_perms = "0700"\n'
        'auth_unix_rw = "none"\n'
        'auth_unix_ro = "none"\n'
    )
    (private / "daemon.conf").write_text(f'unix_sock_dir = "{sockets}"\n{root_only}')
    (private / "storage.conf").write_text(root_only)


def wait_until_answering(daemon: subprocess.Popen[bytes], uri: str, log: Path) -> None:
    deadline = time.monotonic() + START_SECONDS
    while True:
        if daemon.poll() is not None:
            pytest.fail(f"the second libvirtd exited ({daemon.returncode}):\n{log.read_text()}")
        try:
            libvirt.open(uri).close()
            return
        except libvirt.libvirtError:
            if time.monotonic() > deadline:
                pytest.fail(f"the second libvirtd did not answer within {START_SECONDS}s")
            time.sleep(0.1)


def stop(daemon: subprocess.Popen[bytes]) -> None:
    """SIGTERM to its process group (the storage daemon beside it too), SIGKILL if it hangs,
    then whatever of the group is left (the QEMU it probes capabilities with)."""
    os.killpg(daemon.pid, signal.SIGTERM)
    try:
        daemon.wait(timeout=STOP_SECONDS)
    except subprocess.TimeoutExpired:
        daemon.kill()
        daemon.wait(timeout=STOP_SECONDS)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(daemon.pid, signal.SIGKILL)


@contextlib.contextmanager
def daemon_without_kvm() -> Iterator[PrivateDaemon]:
    """The second libvirtd, answering; stopped, and its directory removed, after."""
    private = Path(tempfile.mkdtemp(prefix="pyrigaud-no-kvm-"))
    try:
        skip_unless_namespaces_permitted(private)
        name, storage = daemons_here()
        write_configuration(private)
        log = private / "daemon.log"
        with log.open("wb") as output:
            daemon = subprocess.Popen(
                [
                    *UNSHARE,
                    "sh",
                    "-c",
                    LAUNCHER,
                    "launcher",
                    str(private),
                    name,
                    storage,
                    *PRIVATE_DIRECTORIES,
                ],
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            socket = "libvirt-sock" if name == MONOLITHIC[0] else f"{name}-sock"
            uri = f"qemu+unix:///system?socket={private}/sockets/{socket}"
            wait_until_answering(daemon, uri, log)
            namespace = os.readlink(f"/proc/{daemon.pid}/ns/mnt")
            yield PrivateDaemon(uri=uri, mount_namespace=namespace, private=private)
        finally:
            stop(daemon)
        # A clean shutdown: the daemon removed its own sockets and pid file.
        assert not list((private / "sockets").iterdir())
        assert not (private / "daemon.pid").exists()
    finally:
        shutil.rmtree(private)


def main_daemon_identity() -> dict[str, str]:
    """The machine daemon's pid files and sockets: the same contents and inodes after the test
    mean it was neither restarted nor shadowed."""
    identity = {
        str(pid_file): pid_file.read_text()
        for pid_file in [*Path("/run").glob("libvirtd*.pid"), *Path("/run").glob("virt*.pid")]
    }
    for socket in Path("/run/libvirt").glob("*-sock*"):
        status = socket.stat()
        assert stat.S_ISSOCK(status.st_mode)
        identity[str(socket)] = f"inode {status.st_ino}"
    return identity


def processes_in(mount_namespace: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):  # gone meanwhile
                if os.readlink(entry / "ns/mnt") == mount_namespace:
                    found.append(int(entry.name))
    return found


def our_mounts() -> list[str]:
    return [
        line
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if MOUNT_SOURCE in line
    ]


def test_auto_gives_qemu_domains_on_a_libvirtd_whose_host_offers_no_kvm(
    caplog: pytest.LogCaptureFixture,
) -> None:
    prepare_libvirt_for_process()
    main = open_qemu()
    try:
        identity = main_daemon_identity()
        kvm_here = KVM.is_char_device()
        with daemon_without_kvm() as daemon:
            assert not our_mounts(), "the daemon's mounts leaked into the test's namespace"
            assert KVM.is_char_device() == kvm_here
            raw = libvirt.open(daemon.uri)
            try:
                capabilities = ET.fromstring(raw.getCapabilities())
            finally:
                raw.close()
            assert {str(domain.get("type")) for domain in capabilities.iter("domain")} == {"qemu"}
            connection = LibvirtConnection(daemon.uri)
            backend = libvirt_test_backend(connection, ManualClock(), domain_type="auto")
            try:
                with caplog.at_level(logging.INFO, logger=CAPABILITIES_LOGGER):
                    report = backend.health.check()
                assert report.ok, report.message
                assert report.message.endswith(", qemu (auto) domains")
                said = [record.getMessage() for record in caplog.records]
                assert any(
                    "VMs are qemu domains" in line and "offers no KVM" in line for line in said
                ), said
                # Defined only (Create does not start it): no QEMU runs, the pool is in the tmpfs.
                request = CreateRequest(name="no-kvm", vm_class=VMClass(cpu=1, memory_mib=256))
                vm_id = ok(create_vm(backend, request, OWNER))
                defined = ok(
                    connection.call(lambda conn: conn.lookupByUUIDString(vm_id).XMLDesc(0))
                )
                assert ET.fromstring(defined).get("type") == "qemu"
            finally:
                connection.close()
        assert not processes_in(daemon.mount_namespace), "a process of the namespace is left"
        assert not our_mounts()
        assert not daemon.private.exists()
        assert main_daemon_identity() == identity
        assert main.getLibVersion() > 0
        if kvm_here and os.access(KVM, os.R_OK | os.W_OK):
            # The difference was the hidden /dev/kvm: the machine's daemon offers KVM.
            assert domain_type_offered(main.getCapabilities())[0] == "kvm"
    finally:
        main.close()
