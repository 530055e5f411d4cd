"""A `pyrigaud serve` killed with SIGKILL in the middle of a Create, on real libvirtd.

The test watches libvirt's lifecycle events on its own connection and kills the provider the
moment the Create's building domain is defined, before its volumes and seed are all made; the
next process's start-up sweep must then leave no trace of that Create.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import libvirt
import pytest

from pyrigaud.adapters.hypervisors.libvirt.metadata import NAMESPACE_URI
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb

from support.qemu import EVERYTHING_OF_THE_DOMAIN, QEMU_URI, ensure_dir_pool, open_qemu
from support.replica import Replica

CRASH_POOL = "pyrigaud-crash"
CRASH_POOL_PATH = Path("/var/lib/pyrigaud-test/crash")
NAME_PREFIX = "crash-"
ATTEMPTS = 5  # the kill races the Create's next libvirt calls; each try uses a new name
SWEEP_SECONDS = 60
ENVIRON = {
    "PROVIDER_TYPE": "libvirt",
    "PROVIDER_ENDPOINT": QEMU_URI,
    "LIBVIRT_DOMAIN_TYPE": "qemu",
    "PROVIDER_DEFAULT_DATASTORE": CRASH_POOL,
    "PROVIDER_NAMESPACE": "ns",
    "PROVIDER_NAME": "crash",
}


@pytest.fixture
def conn() -> Iterator[Any]:
    connection = open_qemu()  # after the event loop is registered: events reach us
    _crash_pool(connection)
    _remove_crash_leftovers(connection)
    yield connection
    _remove_crash_leftovers(connection)
    connection.close()


def test_a_create_killed_part_way_is_swept_by_the_next_process(
    conn: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    name = _kill_a_replica_mid_create(conn, tmp_path_factory.mktemp("killed"))
    leftover = conn.lookupByName(name)
    assert _is_building(leftover), "the killed Create left a finished VM: nothing to sweep"

    survivor = Replica(
        {**ENVIRON, "PYRIGAUD_ABANDONED_AFTER_SECONDS": "0"}, tmp_path_factory.mktemp("next")
    )
    try:
        swept = f"killed part-way: VM {name!r}"
        assert survivor.logged(swept, SWEEP_SECONDS)  # the start-up sweep has run
        assert _domain_names(conn) == []
        assert _volume_names(conn) == []
    finally:
        survivor.stop()


def _kill_a_replica_mid_create(conn: Any, home: Path) -> str:
    """The name of a Create whose provider was killed while it was building; fails if every
    attempt's Create finished before the kill landed."""
    for attempt in range(ATTEMPTS):
        name = f"{NAME_PREFIX}{attempt}"
        replica = Replica(ENVIRON, home / name)
        killed = threading.Event()

        def kill_on_first_define(
            _conn: Any, dom: Any, event: int, detail: int, _opaque: object
        ) -> None:
            if (
                event == libvirt.VIR_DOMAIN_EVENT_DEFINED
                and detail == libvirt.VIR_DOMAIN_EVENT_DEFINED_ADDED
                and dom.name() == name  # noqa: B023 - registered and removed per attempt
            ):
                os.kill(replica.pid, signal.SIGKILL)  # noqa: B023
                killed.set()  # noqa: B023

        callback = conn.domainEventRegisterAny(
            None, libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE, kill_on_first_define, None
        )
        try:
            request = pb.CreateRequest(
                name=name,
                class_json='{"CPU":1,"MemoryMiB":256}',
                user_data=b"#cloud-config\nruncmd: [echo crash]\n",
            )
            with pytest.raises(grpc.RpcError):  # the process dies under the call
                replica.stub.Create(request, timeout=60)
            assert killed.wait(10), "the provider died before defining anything"
        finally:
            conn.domainEventDeregisterAny(callback)
            replica.kill()
        if _is_building(conn.lookupByName(name)):
            return name
        _remove_crash_leftovers(conn)
    raise AssertionError(f"every one of {ATTEMPTS} Creates finished before SIGKILL landed")


def _is_building(dom: Any) -> bool:
    root = ET.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    return root.find(f"metadata/{{{NAMESPACE_URI}}}vm/{{{NAMESPACE_URI}}}building") is not None


def _crash_pool(conn: Any) -> Any:
    return ensure_dir_pool(conn, CRASH_POOL, CRASH_POOL_PATH)


def _domain_names(conn: Any) -> list[str]:
    return sorted(
        str(dom.name()) for dom in conn.listAllDomains(0) if dom.name().startswith(NAME_PREFIX)
    )


def _volume_names(conn: Any) -> list[str]:
    return sorted(str(volume.name()) for volume in _crash_pool(conn).listAllVolumes(0))


def _remove_crash_leftovers(conn: Any) -> None:
    for dom in conn.listAllDomains(0):
        if dom.name().startswith(NAME_PREFIX):
            with contextlib.suppress(libvirt.libvirtError):
                if dom.isActive():
                    dom.destroy()
                dom.undefineFlags(EVERYTHING_OF_THE_DOMAIN)
    for volume in _crash_pool(conn).listAllVolumes(0):
        volume.delete(0)
