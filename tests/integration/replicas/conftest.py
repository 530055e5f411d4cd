"""Two `pyrigaud serve` replicas on one hypervisor: the vSphere simulator always, real libvirtd +
QEMU only with PYRIGAUD_TEST_QEMU=1 (its parameter shows skipped otherwise, see support.qemu)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb

from support.qemu import (
    QEMU_URI,
    ensure_dir_pool,
    open_qemu,
    remove_pool_leftovers,
)
from support.qemu_wanted import qemu_param
from support.replica import NAME_PREFIX, Pair, Replica, listed_vms
from support.vsphere import TEMPLATE_VM, running_simulator

BACKENDS = ["vsphere", qemu_param("libvirt")]
# Not support.qemu's pyrigaud-test pool: other QEMU suites sweep that one whole, and would
# remove these VMs (and these tests theirs) when they run at the same time.
REPLICA_POOL = "pyrigaud-replicas"
REPLICA_POOL_PATH = Path("/var/lib/pyrigaud-test/replicas")


@pytest.fixture(scope="module", params=BACKENDS)
def pair(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pair]:
    home = tmp_path_factory.mktemp(request.param)
    if request.param == "libvirt":
        yield from _libvirt_pair(home)
    else:
        yield from _vsphere_pair(home)


def _libvirt_pair(home: Path) -> Iterator[Pair]:
    conn = open_qemu()
    try:
        _remove_replica_leftovers(conn)
        environ = {
            "PROVIDER_TYPE": "libvirt",
            "PROVIDER_ENDPOINT": QEMU_URI,
            "LIBVIRT_DOMAIN_TYPE": "qemu",
            "PROVIDER_DEFAULT_DATASTORE": REPLICA_POOL,
            "PROVIDER_NAMESPACE": "ns",
            "PROVIDER_NAME": "p",
        }
        yield from _running_pair(
            "libvirt", environ, home, image_json="", guest_obeys_shutdown=False
        )
        assert _remove_replica_leftovers(conn) == [], "gRPC Delete left domains or volumes behind"
    finally:
        _remove_replica_leftovers(conn)
        conn.close()


def _vsphere_pair(home: Path) -> Iterator[Pair]:
    with running_simulator() as simulator:
        environ = simulator.serve_environ(PROVIDER_NAMESPACE="ns", PROVIDER_NAME="p")
        image_json = json.dumps({"TemplateName": TEMPLATE_VM})
        yield from _running_pair(
            "vsphere", environ, home, image_json=image_json, guest_obeys_shutdown=True
        )


def _running_pair(
    backend: str,
    environ: dict[str, str],
    home: Path,
    *,
    image_json: str,
    guest_obeys_shutdown: bool,
) -> Iterator[Pair]:
    a = Replica(environ, home / "a")
    try:
        b = Replica(environ, home / "b")
        try:
            yield Pair(backend, a, b, image_json, guest_obeys_shutdown)
            _delete_what_the_tests_made(b)
        finally:
            b.stop()
    finally:
        a.stop()


def _delete_what_the_tests_made(replica: Replica) -> None:
    """Through gRPC, as a manager would; the libvirt pool sweep catches anything left."""
    for vm in listed_vms(replica.stub):
        if vm.name.startswith(NAME_PREFIX):
            replica.stub.Delete(pb.DeleteRequest(id=vm.id), timeout=60)


def _replica_pool(conn: Any) -> Any:
    return ensure_dir_pool(conn, REPLICA_POOL, REPLICA_POOL_PATH)


def _remove_replica_leftovers(conn: Any) -> list[str]:
    """Every domain using the replica pool and every volume in it, gone; the names."""
    return remove_pool_leftovers(conn, REPLICA_POOL, REPLICA_POOL_PATH)
