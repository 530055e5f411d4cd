"""ExportDisk and ImportDisk over every remote libvirt transport, through gRPC as the manager
sends them: qemu+ssh and qemu+libssh to the real system daemon (sshd on loopback, a key from a
Secret), and qemu+tcp with a SASL password to an unprivileged daemon of its own. The bytes travel
through libvirt's volume streams over that transport, staged on a PVC folder or moto's S3 server.

A VM made from a raw volume of random bytes is snapshotted, then written to past the snapshot:
the state at the snapshot, the current state (exported, imported back, a VM made from it) and
what that VM's disk holds are each compared byte for byte with what was written.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import libvirt
import pytest

from pyrigaud.adapters.hypervisors.libvirt.storage import upload_volume, volume_xml
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb

from support.e2e import RunningProvider, create_vm, start_provider
from support.qemu import (
    TEST_POOL,
    TEST_POOL_PATH,
    ensure_dir_pool,
    open_qemu,
    remove_pool_leftovers,
)
from support.ssh import SASL_USER, SaslDaemon, SecretWriter, SshServer, Started, good_secret
from support.staging import (
    S3Server,
    StagingCase,
    migration_name,
    pvc_case,
    s3_case,
    s3_credentials,
    s3_options,
)

MiB = 1024**2
BASE_BYTES = 20 * MiB  # over one of the 16 MiB ranges a volume download streams at a time
WRITTEN = b"\x55" * MiB  # what the guest "writes" at offset 0 after the snapshot
TRANSFER_SECONDS = 1800  # the manager's deadline for ExportDisk and ImportDisk
SESSION_POOL = "pyrigaud-transfer"


@dataclass(frozen=True)
class Daemon:
    """The daemon a transport reaches, as the provider names it, and as the test opens it."""

    endpoint: str
    secret: dict[str, str]
    conn: Any  # the test's own connection, for setup and checks
    pool: str
    pool_path: Path


def _system_daemon(transport: str, sshd: SshServer) -> Iterator[Daemon]:
    conn = open_qemu()
    try:
        remove_pool_leftovers(conn, TEST_POOL, TEST_POOL_PATH)
        yield Daemon(
            f"qemu+{transport}://127.0.0.1:{sshd.port}/system",
            good_secret(sshd),
            conn,
            TEST_POOL,
            TEST_POOL_PATH,
        )
        remove_pool_leftovers(conn, TEST_POOL, TEST_POOL_PATH)
    finally:
        conn.close()


def _session_daemon(daemon: SaslDaemon) -> Iterator[Daemon]:
    def answer(credentials: list[list[Any]], _: object) -> int:
        for credential in credentials:
            if credential[0] == libvirt.VIR_CRED_AUTHNAME:
                credential[4] = SASL_USER
            elif credential[0] == libvirt.VIR_CRED_PASSPHRASE:
                credential[4] = daemon.password
        return 0

    asked = [libvirt.VIR_CRED_AUTHNAME, libvirt.VIR_CRED_PASSPHRASE]
    conn = libvirt.openAuth(daemon.uri, [asked, answer, None], 0)
    pool_path = daemon.home / "pool"  # the daemon's account owns what it makes there
    try:
        remove_pool_leftovers(conn, SESSION_POOL, pool_path)
        secret = {"username": SASL_USER, "password": daemon.password}
        yield Daemon(daemon.uri, secret, conn, SESSION_POOL, pool_path)
        remove_pool_leftovers(conn, SESSION_POOL, pool_path)
    finally:
        conn.close()


@pytest.fixture(params=["ssh", "libssh", "tcp"])
def daemon(request: pytest.FixtureRequest) -> Iterator[Daemon]:
    if request.param == "tcp":
        yield from _session_daemon(request.getfixturevalue("sasl_daemon"))
    else:
        yield from _system_daemon(request.param, request.getfixturevalue("sshd"))


@dataclass(frozen=True)
class Staged:
    """One staging backend as the manager names it: type, URLs, options and credentials."""

    case: StagingCase
    options_json: str
    credentials: dict[str, str]

    def url(self, name: str) -> str:
        return self.case.locate(name).url

    def stored(self, name: str) -> bytes | None:
        return self.case.stored(self.case.locate(name))


@pytest.fixture(params=["pvc", "s3"])
def staged(request: pytest.FixtureRequest, tmp_path: Path) -> Staged:
    migration = migration_name(request)
    if request.param == "pvc":
        return Staged(pvc_case(tmp_path / "migration-storage", migration), "", {})
    server: S3Server = request.getfixturevalue("s3_server")
    options = json.dumps(s3_options(server))
    return Staged(s3_case(server, migration), options, s3_credentials(server))


@dataclass
class Provider:
    running: RunningProvider
    staged: Staged

    def export(self, vm_id: str, name: str, disk_format: str, snapshot_id: str = "") -> Any:
        return self.running.stub.ExportDisk(
            pb.ExportDiskRequest(
                vm_id=vm_id,
                snapshot_id=snapshot_id,
                destination_url=self.staged.url(name),
                format=disk_format,
                credentials=self.staged.credentials,
                backend_type=self.staged.case.backend,
                transfer_mode="relay",
                storage_options_json=self.staged.options_json,
            ),
            timeout=TRANSFER_SECONDS,
        )

    def import_(self, name: str, target_name: str, checksum: str) -> Any:
        return self.running.stub.ImportDisk(
            pb.ImportDiskRequest(
                source_url=self.staged.url(name),
                format="qcow2",
                target_name=target_name,
                verify_checksum=True,
                expected_checksum=checksum,
                credentials=self.staged.credentials,
                backend_type=self.staged.case.backend,
                transfer_mode="relay",
                storage_options_json=self.staged.options_json,
            ),
            timeout=TRANSFER_SECONDS,
        )

    def vm(self, name: str, path: str, disk_format: str) -> str:
        image = json.dumps({"Path": path, "Format": disk_format, "ChecksumType": "sha256"})
        vm_id = create_vm(self.running.stub, name, image_json=image)
        self.running.stub.Power(pb.PowerRequest(id=vm_id, op=pb.POWER_OP_OFF), timeout=60)
        return vm_id


@pytest.fixture
def provider(
    daemon: Daemon, staged: Staged, write_secret: SecretWriter, started: Started, tmp_path: Path
) -> Provider:
    running = start_provider(
        {
            "PROVIDER_TYPE": "libvirt",
            "PROVIDER_ENDPOINT": daemon.endpoint,
            "PYRIGAUD_CREDENTIALS": "files",
            "PYRIGAUD_CREDENTIALS_DIR": str(write_secret(daemon.secret)),
            "LIBVIRT_DOMAIN_TYPE": "qemu",
            "PROVIDER_DEFAULT_DATASTORE": daemon.pool,
            "PYRIGAUD_MIGRATION_STORAGE_ROOT": str(tmp_path / "migration-storage"),
        }
    )
    started.append(running)
    return Provider(running, staged)


def _base_volume(daemon: Daemon, content: bytes) -> str:
    """A raw volume of `content` in the daemon's pool, uploaded over the test's connection."""
    pool = ensure_dir_pool(daemon.conn, daemon.pool, daemon.pool_path)
    volume = pool.createXML(volume_xml("xport-base.raw", len(content), volume_format="raw"), 0)
    upload_volume(
        daemon.conn, volume, (content[at : at + MiB] for at in range(0, len(content), MiB))
    )
    return str(volume.path())


def test_a_disk_and_its_snapshot_cross_the_transport_both_ways_with_their_data(
    daemon: Daemon, provider: Provider
) -> None:
    content = os.urandom(BASE_BYTES)
    source = provider.vm("xport-source", _base_volume(daemon, content), "raw")
    stub = provider.running.stub
    snapshot = stub.SnapshotCreate(
        pb.SnapshotCreateRequest(vm_id=source, name_hint="migration"), timeout=120
    ).snapshot_id
    disk = stub.GetDiskInfo(pb.GetDiskInfoRequest(vm_id=source), timeout=120).path
    # The daemons run on this machine: the disk file is written past libvirt, as a guest would.
    written = subprocess.run(
        ["qemu-io", "-c", f"write -P 0x55 0 {len(WRITTEN)}", disk], capture_output=True, check=False
    )
    assert written.returncode == 0, written.stderr
    now = WRITTEN + content[len(WRITTEN) :]

    at_snapshot = provider.export(source, "snap.raw", "raw", snapshot_id=snapshot)
    assert provider.staged.stored("snap.raw") == content
    exported = provider.export(source, "now.qcow2", "qcow2")
    imported = provider.import_("now.qcow2", "xport-restored", exported.checksum)
    copy = provider.vm("xport-copy", imported.path, "qcow2")
    provider.export(copy, "copy.raw", "raw")

    assert imported.checksum == exported.checksum
    assert at_snapshot.checksum != exported.checksum
    assert provider.staged.stored("copy.raw") == now
    assert provider.staged.case.leftovers() == [], "a staged temporary was left behind"


def _volume_names(daemon: Daemon) -> set[str]:
    pool = daemon.conn.storagePoolLookupByName(daemon.pool)
    pool.refresh(0)
    return {str(volume.name()) for volume in pool.listAllVolumes(0)}


def _refused(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as refused:
        call()
    return refused.value


def test_retries_and_wrong_checksums_leave_no_volume_behind_over_the_transport(
    daemon: Daemon, provider: Provider
) -> None:
    """The temporary volumes an import stages in, and removes, live on the remote daemon."""
    content = os.urandom(BASE_BYTES)
    source = provider.vm("xport-retried", _base_volume(daemon, content), "raw")
    exported = provider.export(source, "r.qcow2", "qcow2")
    provider.export(source, "r.raw", "raw")  # other bytes, which that checksum does not fit
    first = provider.import_("r.qcow2", "xport-again", exported.checksum)
    volumes = _volume_names(daemon)

    again = provider.import_("r.qcow2", "xport-again", exported.checksum)
    wrong = _refused(lambda: provider.import_("r.raw", "xport-wrong", exported.checksum))

    assert again == first  # its first answer was lost
    assert wrong.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "expected_checksum" in (wrong.details() or "")
    assert _volume_names(daemon) == volumes, "a retry or a refused import left a volume"
