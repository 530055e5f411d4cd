"""A Create killed part-way, on the test driver: what it leaves, and who removes it.

The process "dies" inside the seed upload (the backend's volume-writer seam raises a
BaseException, which no cleanup path catches, as a SIGKILL would skip them all): by then the
building domain is defined and the root volume made. The process-level SIGKILL test on real
libvirtd is in tests/integration/replicas/test_crash.py.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrigaud.adapters.hypervisors.libvirt.connection import LibvirtConnection
from pyrigaud.adapters.hypervisors.libvirt.metadata import NAMESPACE_URI
from pyrigaud.application.keyed_lock import KeyedLock
from pyrigaud.application.ownership import OwnershipRule
from pyrigaud.application.use_cases.create_vm import CreateVM
from pyrigaud.application.use_cases.sweep_leftovers import SweepLeftovers
from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.leftovers import CREATE_DEADLINE_SECONDS, LeftoverPolicy
from pyrigaud.domain.models import CloneRequest, CreateRequest, DiskSpec, OwnerMark, VMClass

from support import ManualClock, error_of, ok
from support.libvirt import (
    clone_vm,
    create_vm,
    isolated_host_uri,
    libvirt_test_backend,
    make_backend,
    write_pool_file,
)

OWNER = OwnerMark(provider="tests/libvirt-crash")
POLICY = LeftoverPolicy(owner=OWNER)


class ProcessKilled(BaseException):
    """What a SIGKILL looks like from inside: nothing after it runs."""


def killed_mid_upload(conn: Any, volume: Any, chunks: Iterable[bytes]) -> None:
    raise ProcessKilled


class Host:
    def __init__(self, tmp_path: Path, clock: ManualClock) -> None:
        uri = isolated_host_uri(tmp_path)
        self.clock = clock
        self.crashing, self._crashing_connection = make_backend(
            uri, clock, volume_writer=killed_mid_upload
        )
        # A restarted process: a fresh connection to the same host file's state is a fresh
        # copy of the node XML on the test driver, so both adapters share one connection.
        self.backend = libvirt_test_backend(
            self._crashing_connection, clock, domain_type="test", volume_writer=write_pool_file
        )
        self.connection: LibvirtConnection = self._crashing_connection

    def volumes(self) -> list[str]:
        return sorted(
            ok(
                self.connection.call(
                    lambda conn: [
                        str(volume.name())
                        for volume in conn.storagePoolLookupByName("default").listAllVolumes(0)
                    ]
                )
            )
        )

    def crash_a_create(self, name: str) -> None:
        with pytest.raises(ProcessKilled):
            create_vm(self.crashing, seeded_request(name), OWNER)

    def create_vm(self, policy: LeftoverPolicy = POLICY) -> CreateVM:
        ownership = OwnershipRule(self.backend.lifecycle, OWNER, self.clock, policy, KeyedLock())
        return CreateVM(self.backend.lifecycle, ownership)


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    made = Host(tmp_path, ManualClock())
    yield made
    made.connection.close()


def seeded_request(name: str) -> CreateRequest:
    return CreateRequest(
        name=name,
        vm_class=VMClass(cpu=1, memory_mib=256),
        disks=(DiskSpec(size_gib=1),),
        user_data=b"#cloud-config\n",
    )


def kinds(volume_names: list[str]) -> list[str]:
    """`vm-disk0-<random>.qcow2` -> `disk0`: the names carry a per-attempt suffix."""
    return sorted(name.split("-")[-2] for name in volume_names)


def test_a_killed_create_leaves_one_marked_domain_that_records_every_volume(host: Host) -> None:
    began = host.clock.now()
    host.crash_a_create("crashed")
    record = ok(host.backend.lifecycle.find_by_name("crashed"))
    assert record is not None
    assert record.owner == OWNER
    assert record.building_since == began
    assert ok(host.backend.lifecycle.find_unfinished()) == [record]
    xml = ok(host.connection.call(lambda conn: conn.lookupByName("crashed").XMLDesc(0)))
    recorded = ET.fromstring(xml).findall(f".//{{{NAMESPACE_URI}}}volume")
    recorded_names = sorted(Path(element.get("path", "")).name for element in recorded)
    assert kinds(recorded_names) == ["cidata", "disk0", "disk1"]
    assert host.volumes() == recorded_names[1:]  # the disks, made before the "kill"


def test_delete_removes_a_leftover_whole(host: Host) -> None:
    host.crash_a_create("crashed")
    record = ok(host.backend.lifecycle.find_by_name("crashed"))
    assert record is not None
    ok(host.backend.lifecycle.delete(record.id))
    assert ok(host.backend.lifecycle.find_by_name("crashed")) is None
    assert host.volumes() == []


def test_the_next_create_of_the_name_replaces_an_abandoned_leftover(host: Host) -> None:
    host.crash_a_create("crashed")
    host.clock.advance(CREATE_DEADLINE_SECONDS)
    made = ok(host.create_vm()(seeded_request("crashed")))
    record = ok(host.backend.lifecycle.find_by_name("crashed"))
    assert record is not None
    assert record.id == made.id
    assert record.building_since is None
    assert ok(host.backend.lifecycle.find_unfinished()) == []
    assert kinds(host.volumes()) == ["cidata", "disk0", "disk1"]


def test_a_young_leftover_is_waited_for_not_removed(host: Host) -> None:
    host.crash_a_create("crashed")
    error = error_of(host.create_vm()(seeded_request("crashed")))
    assert error.kind is ErrorKind.UNAVAILABLE
    assert "still being created" in error.message
    assert len(ok(host.backend.lifecycle.find_unfinished())) == 1


def test_the_sweep_removes_abandoned_leftovers_and_leaves_finished_vms(host: Host) -> None:
    host.crash_a_create("crashed")
    finished = ok(host.create_vm()(seeded_request("finished"))).id
    host.clock.advance(CREATE_DEADLINE_SECONDS)
    report = ok(SweepLeftovers(host.backend.lifecycle, host.clock, POLICY)())
    assert report.removed == ("crashed",)
    assert [vm.id for vm in ok(host.backend.inventory.list_vms())] == [finished]
    assert all(name.startswith("finished-") for name in host.volumes())
    assert kinds(host.volumes()) == ["cidata", "disk0", "disk1"]


def test_a_finished_clone_carries_no_building_mark(host: Host) -> None:
    source = ok(host.create_vm()(seeded_request("source"))).id
    copy = ok(clone_vm(host.backend, CloneRequest(source_vm_id=source, target_name="copy"), OWNER))
    record = ok(host.backend.lifecycle.find_by_name("copy"))
    assert record is not None
    assert record.id == copy
    assert record.building_since is None
    assert ok(host.backend.lifecycle.find_unfinished()) == []
