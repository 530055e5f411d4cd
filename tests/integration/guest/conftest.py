"""The real-guest end-to-end tests: a `pyrigaud serve` process on the real libvirtd + QEMU,
booting the image scripts/guest_image.sh builds. Run only with PYRIGAUD_TEST_QEMU=1, shown
skipped otherwise (see support.qemu); once wanted, anything missing fails the test."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb

from support.guest import guest_image
from support.qemu import QEMU_URI, ensure_dir_pool, open_qemu, remove_pool_leftovers
from support.replica import Replica
from support.vsphere import SIMULATOR_DATASTORE, shared_simulator

# Not support.qemu's pool: other QEMU suites sweep that one whole while they run.
GUEST_POOL = "pyrigaud-guest"
GUEST_POOL_PATH = Path("/var/lib/pyrigaud-test/guest")
PREPARED_NAME = "guest-e2e-base"


@pytest.fixture(scope="session")
def image() -> Path:
    return guest_image()


@pytest.fixture(scope="module")
def conn() -> Iterator[Any]:
    """A raw connection to watch what the provider does; the pool is swept before and after."""
    connection = open_qemu()
    try:
        remove_pool_leftovers(connection, GUEST_POOL, GUEST_POOL_PATH)
        yield connection
    finally:
        remove_pool_leftovers(connection, GUEST_POOL, GUEST_POOL_PATH)
        connection.close()


@pytest.fixture(scope="module")
def pool(conn: Any) -> Any:
    return ensure_dir_pool(conn, GUEST_POOL, GUEST_POOL_PATH)


@pytest.fixture(scope="module")
def migration_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the PVCs of pvc:// staging URLs are mounted, for every provider of a module."""
    return tmp_path_factory.mktemp("migration-storage")


@pytest.fixture(scope="module")
def provider(
    pool: Any, migration_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replica]:
    environ = {
        "PROVIDER_TYPE": "libvirt",
        "PROVIDER_ENDPOINT": QEMU_URI,
        "LIBVIRT_DOMAIN_TYPE": "qemu",
        "PROVIDER_DEFAULT_DATASTORE": GUEST_POOL,
        "PROVIDER_NAMESPACE": "ns",
        "PROVIDER_NAME": "guest-e2e",
        "PYRIGAUD_MIGRATION_STORAGE_ROOT": str(migration_root),
    }
    replica = Replica(environ, tmp_path_factory.mktemp("guest-provider"))
    yield replica
    replica.stop()


@pytest.fixture(scope="module")
def prepared_image(provider: Replica, image: Path) -> str:
    """ImagePrepare from the image's local path, into the guest pool: the prepared path."""
    request = pb.ImagePrepareRequest(
        image_json=json.dumps({"source": {"libvirt": {"path": str(image), "format": "qcow2"}}}),
        target_name=PREPARED_NAME,
        storage_hint=GUEST_POOL,
    )
    prepared = provider.stub.ImagePrepare(request, timeout=300)
    assert prepared.prepared_image_path, prepared
    return prepared.prepared_image_path


@pytest.fixture(scope="module")
def vsphere(
    migration_root: Path, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replica]:
    """`pyrigaud serve` on the vSphere simulator, mounting the same PVCs as the libvirt one."""
    name = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_").replace("_", "-")
    environ = shared_simulator().serve_environ(
        PROVIDER_DEFAULT_DATASTORE=SIMULATOR_DATASTORE,
        PROVIDER_NAMESPACE="ns",
        PROVIDER_NAME=f"{name}-vsphere",
        PYRIGAUD_MIGRATION_STORAGE_ROOT=str(migration_root),
    )
    replica = Replica(environ, tmp_path_factory.mktemp(f"{name}-vsphere"))
    yield replica
    replica.stop()
