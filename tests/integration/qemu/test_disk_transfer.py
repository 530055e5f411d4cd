"""ExportDisk / ImportDisk on real libvirtd + QEMU, staged on a PVC folder, moto's S3 server and
nfs-ganesha (all on loopback), with the requests read by the wire parsers as the manager sends
them.

Everything lives in a pool of its own, emptied before and after each test. The base image is a
raw volume of random bytes, so a round trip (export, import, Create from the import, export
again as raw) shows the guest's data came back, not just an object with the right checksum.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import subprocess
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pyrigaud.adapters.hypervisors.libvirt.connection import LibvirtConnection
from pyrigaud.adapters.hypervisors.libvirt.storage import (
    PoolSettings,
    upload_volume,
    volume_facts,
    volume_xml,
)
from pyrigaud.adapters.hypervisors.libvirt.volume_streams import (
    ZEROS,
    TransferVolumes,
    volume_chunks,
)
from pyrigaud.application.backend import Backend
from pyrigaud.application.use_cases.capabilities import TransferClaims
from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.models import (
    CreateRequest,
    DiskDefaults,
    DiskQuery,
    OwnerMark,
    SnapshotRequest,
    VMClass,
    VMImage,
)
from pyrigaud.domain.power import PowerState

from support import ManualClock, error_kind, error_of, ok
from support.image_corpus import HOSTILE, VALID, hostile_image, oracle_raw, valid_image
from support.libvirt import libvirt_test_backend
from support.qemu import (
    QEMU_URI,
    open_qemu,
    random_base_volume,
    remove_pool_leftovers,
)
from support.small_filesystem import small_filesystem
from support.staging import (
    NfsServer,
    S3Server,
    StagingCase,
    migration_name,
    nfs_case,
    nfs_options,
    pvc_case,
    s3_case,
    s3_credentials,
    s3_options,
)
from support.transfer import (
    REACHABLE_STAGING,
    TRANSFER_OWNER,
    DiskMoves,
    disk_moves,
    export_disk,
    import_disk,
)

POOL = "pyrigaud-transfer"
POOL_PATH = Path("/var/lib/pyrigaud-test/transfer")
BASE_BYTES = 36 * 1024**2  # over one of the 32 MiB ranges a volume download streams at a time
OWNER = OwnerMark(provider="tests/disk-transfer")
SMALL = VMClass(cpu=1, memory_mib=256)
OFFSET_MASK = 0x00FFFFFFFFFFFE00  # a qcow2 L1 or L2 entry's offset bits
RECORD = ".pyrigaud-import.json"


@dataclass
class Staged:
    """One staging backend as the manager names it: URL, options and credentials."""

    case: StagingCase
    options: dict[str, object]
    credentials: dict[str, str]

    @property
    def backend(self) -> str:
        return self.case.backend

    def url(self, name: str) -> str:
        return self.case.locate(name).url

    def stored(self, name: str) -> bytes | None:
        return self.case.stored(self.case.locate(name))

    def put(self, name: str, content: bytes) -> None:
        """An object staged past the provider (what another exporter left)."""
        writer = ok(self.case.storage.open_write(self.case.locate(name), len(content)))
        ok(writer.write(content))
        ok(writer.commit())


@dataclass
class Site:
    backend: Backend
    moves: DiskMoves
    conn: Any
    staged: Staged
    base: str  # a raw volume of random bytes
    content: bytes

    def volume_names(self) -> set[str]:
        pool = self.conn.storagePoolLookupByName(POOL)
        pool.refresh(0)
        return {str(volume.name()) for volume in pool.listAllVolumes(0)}

    def vm(self, name: str, path: str | None = None, image_format: str = "raw") -> str:
        image = VMImage(path=path or self.base, format=image_format)
        request = CreateRequest(name=name, vm_class=SMALL, image=image)
        return ok(self.backend.lifecycle.start_create(request, OWNER)).id

    def export(
        self, vm_id: str, name: str, disk_format: str = "qcow2", snapshot_id: str = ""
    ) -> Any:
        return export_disk(
            self.moves,
            vm_id,
            self.staged.url(name),
            backend=self.staged.backend,
            disk_format=disk_format,
            snapshot_id=snapshot_id,
            options=self.staged.options,
            credentials=self.staged.credentials,
        )

    def import_(
        self, name: str, target: str, *, checksum: str = "", disk_format: str = "qcow2"
    ) -> Any:
        return import_disk(
            self.moves,
            self.staged.url(name),
            target_name=target,
            backend=self.staged.backend,
            disk_format=disk_format,
            expected_checksum=checksum,
            options=self.staged.options,
            credentials=self.staged.credentials,
        )


def _staged(kind: str, request: pytest.FixtureRequest, root: Path) -> Staged:
    migration = migration_name(request)
    if kind == "pvc":
        return Staged(pvc_case(root, migration), {}, {})
    if kind == "s3":
        server: S3Server = request.getfixturevalue("s3_server")
        return Staged(s3_case(server, migration), s3_options(server), s3_credentials(server))
    nfs: NfsServer = request.getfixturevalue("nfs_server")
    return Staged(nfs_case(nfs, migration), nfs_options(nfs), {})


@pytest.fixture(params=["pvc", "s3", "nfs"])
def site(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Site]:
    yield from _site(request.param, request, tmp_path / "migration-storage")


def _site(
    kind: str, request: pytest.FixtureRequest, root: Path, scratch_dir: Path | None = None
) -> Generator[Site]:
    """The site staging through `kind`; a PVC's folders are made under `root`, scratch files
    in `scratch_dir` (None: the system's temporary directory)."""
    conn = open_qemu()
    remove_pool_leftovers(conn, POOL, POOL_PATH)
    staged = _staged(kind, request, root)
    base, content = random_base_volume(conn, POOL, POOL_PATH, "xfer-base.raw", BASE_BYTES)
    connection = LibvirtConnection(QEMU_URI)
    backend = libvirt_test_backend(
        connection,
        ManualClock(),
        domain_type="qemu",
        pools=PoolSettings(default_pool=POOL, default_pool_path=str(POOL_PATH)),
        scratch_dir=str(scratch_dir) if scratch_dir else None,
    )
    try:
        yield Site(backend, disk_moves(backend, root), conn, staged, base, content)
    finally:
        connection.close()
        remove_pool_leftovers(conn, POOL, POOL_PATH)
        conn.close()


def _sha256(content: bytes | None) -> str:
    assert content is not None
    return hashlib.sha256(content).hexdigest()


def test_capabilities_tell_what_moves_and_how(site: Site) -> None:
    told = site.backend.capabilities.capabilities()
    # As the container serves them: the staging types and the mode are the application's.
    caps = TransferClaims(site.backend.capabilities, REACHABLE_STAGING).capabilities()
    assert told.supported_export_backends == told.supported_transfer_modes == ()

    assert caps.supports_disk_export
    assert caps.supports_disk_import
    assert caps.supported_export_formats == ("qcow2", "raw")
    assert caps.supported_import_formats == ("qcow2", "raw", "vmdk")
    # What this machine's staging reaches: the s3 extra and libnfs are installed here.
    assert caps.supported_export_backends == caps.supported_import_backends == ("pvc", "nfs", "s3")
    assert caps.supported_transfer_modes == ("relay",)
    assert not caps.supports_export_compression


def test_a_disk_goes_out_comes_back_and_boots_a_new_vm_with_its_data(site: Site) -> None:
    source = site.vm("xfer-source")
    before = site.volume_names()

    exported = ok(site.export(source, "export.qcow2"))
    staged = site.staged.stored("export.qcow2")
    assert staged is not None
    assert staged[:4] == b"QFI\xfb"
    assert exported.checksum == _sha256(staged)  # lowercase hex, no prefix (docs/migration.md)
    assert exported.estimated_size_bytes == len(staged)
    assert site.staged.case.leftovers() == [], "a staged temporary was left behind"
    assert site.volume_names() == before, "the flattened copy made for the export was kept"

    imported = ok(site.import_("export.qcow2", "xfer-restored", checksum=exported.checksum))
    assert imported.checksum == exported.checksum
    assert imported.actual_size_bytes == len(staged)
    assert imported.disk_id == "xfer-restored.qcow2"
    facts = volume_facts(site.conn, imported.path)
    assert facts is not None
    assert (facts.format, facts.capacity_bytes, facts.backing_path) == ("qcow2", BASE_BYTES, "")
    record = "xfer-restored.qcow2.pyrigaud-import.json"  # the answer, for a retry
    assert site.volume_names() == before | {"xfer-restored.qcow2", record}, "a temporary was kept"

    copy = site.vm("xfer-copy", imported.path, "qcow2")
    raw = ok(site.export(copy, "copy.raw", "raw"))
    assert site.staged.stored("copy.raw") == site.content
    assert raw.checksum == _sha256(site.content)
    ok(site.backend.power.power_on(copy))
    assert ok(site.backend.power.power_state(copy)) is PowerState.ON


def test_qcow2_bytes_under_a_vmdk_key_and_real_vmdk_bytes_both_land_as_qcow2(
    site: Site, tmp_path: Path
) -> None:
    source = site.vm("xfer-named")
    exported = ok(site.export(source, "export.vmdk"))  # the manager's S3 key, qcow2 inside
    named = ok(
        site.import_("export.vmdk", "xfer-named", checksum=exported.checksum, disk_format="vmdk")
    )
    raw_file = tmp_path / "disk.raw"
    raw_file.write_bytes(site.content)
    vmdk_file = tmp_path / "disk.vmdk"
    subprocess.run(
        ["qemu-img", "convert", "-f", "raw", "-O", "vmdk", str(raw_file), str(vmdk_file)],
        check=True,
    )
    site.staged.put("real.vmdk", vmdk_file.read_bytes())
    vmdk = ok(site.import_("real.vmdk", "xfer-vmdk", disk_format="vmdk"))

    for imported in (named, vmdk):
        facts = volume_facts(site.conn, imported.path)
        assert facts is not None
        assert (facts.format, facts.capacity_bytes) == ("qcow2", BASE_BYTES)
    assert vmdk.checksum == hashlib.sha256(vmdk_file.read_bytes()).hexdigest()
    copy = site.vm("xfer-from-vmdk", vmdk.path, "qcow2")
    ok(site.export(copy, "back.raw", "raw"))
    assert site.staged.stored("back.raw") == site.content


def test_transfers_retried_after_success_answer_the_same(site: Site) -> None:
    source = site.vm("xfer-retried")
    first_export = ok(site.export(source, "r.qcow2"))
    assert ok(site.export(source, "r.qcow2")) == first_export  # its first answer was lost

    first = ok(site.import_("r.qcow2", "xfer-again", checksum=first_export.checksum))
    volumes = site.volume_names()
    assert ok(site.import_("r.qcow2", "xfer-again", checksum=first_export.checksum)) == first
    assert site.volume_names() == volumes, "a retry left a duplicate or a temporary"

    site.staged.put("other.raw", os.urandom(65536))
    clash = site.import_("other.raw", "xfer-again", disk_format="raw")
    assert error_of(clash).kind is ErrorKind.ALREADY_EXISTS
    assert "other content" in error_of(clash).message
    assert site.volume_names() == volumes


def test_other_bytes_of_the_same_disk_under_an_imported_name_clash(site: Site) -> None:
    """The record beside an imported disk names the staged bytes it came from: the same disk
    staged as raw is not the qcow2 that was imported, though both would convert alike."""
    source = site.vm("xfer-recorded")
    as_qcow2 = ok(site.export(source, "d.qcow2"))
    ok(site.export(source, "d.raw", "raw"))
    ok(site.import_("d.qcow2", "xfer-recorded-in", checksum=as_qcow2.checksum))
    volumes = site.volume_names()
    assert "xfer-recorded-in.qcow2.pyrigaud-import.json" in volumes

    clash = site.import_("d.raw", "xfer-recorded-in", disk_format="raw")
    assert error_of(clash).kind is ErrorKind.ALREADY_EXISTS
    assert site.volume_names() == volumes


def test_the_record_of_a_deleted_disk_does_not_stop_a_new_import(site: Site) -> None:
    source = site.vm("xfer-forgotten")
    ok(site.export(source, "f.raw", "raw"))
    first = ok(site.import_("f.raw", "xfer-forgotten-in", disk_format="raw"))
    volumes = site.volume_names()
    site.conn.storageVolLookupByPath(first.path).delete(0)  # deleted outside pyrigaud

    site.staged.put("g.raw", os.urandom(65536))
    again = ok(site.import_("g.raw", "xfer-forgotten-in", disk_format="raw"))
    assert again.path == first.path
    assert again.checksum != first.checksum
    assert site.volume_names() == volumes


def test_a_wrong_checksum_imports_nothing(site: Site) -> None:
    source = site.vm("xfer-checked")
    ok(site.export(source, "c.qcow2"))
    before = site.volume_names()

    wrong = site.import_("c.qcow2", "xfer-wrong", checksum="0" * 64)

    assert error_of(wrong).kind is ErrorKind.FAILED_PRECONDITION
    assert "expected_checksum" in error_of(wrong).message
    assert site.volume_names() == before


def test_a_running_vm_is_refused(site: Site) -> None:
    source = site.vm("xfer-running")
    ok(site.backend.power.power_on(source))

    running = site.export(source, "r.qcow2")

    assert error_of(running).kind is ErrorKind.FAILED_PRECONDITION
    assert "power it off" in error_of(running).message
    assert site.staged.stored("r.qcow2") is None


@pytest.fixture
def pvc_site(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Site]:
    """The site on a PVC only (what is staged matters, not where)."""
    yield from _site("pvc", request, tmp_path / "migration-storage")


def _image_of(site: Site, tmp_path: Path, disk_format: str) -> bytes:
    raw_file = tmp_path / "disk.raw"
    raw_file.write_bytes(site.content)
    image = tmp_path / f"disk.{disk_format}"
    subprocess.run(
        ["qemu-img", "convert", "-f", "raw", "-O", disk_format, str(raw_file), str(image)],
        check=True,
    )
    return image.read_bytes()


def test_an_image_of_a_format_not_staged_here_is_refused_by_name_and_leaves_nothing(
    pvc_site: Site, tmp_path: Path
) -> None:
    site = pvc_site
    site.staged.put("disk.vhdx", _image_of(site, tmp_path, "vhdx"))
    before = site.volume_names()

    refused = site.import_("disk.vhdx", "xfer-vhdx", disk_format="raw")

    assert error_of(refused).kind is ErrorKind.INVALID_SPEC
    assert "vhdx image: convert it to qcow2 first" in error_of(refused).message
    assert site.volume_names() == before


@pytest.mark.parametrize(
    ("with_snapshot", "refused_by"),
    [
        (True, "qemu-img on the libvirt host refuses the staged image"),
        (False, "places a data cluster off a cluster boundary"),
    ],
)
def test_a_qcow2_whose_l2_table_qemu_refuses_is_bad_input_and_leaves_nothing(
    pvc_site: Site, tmp_path: Path, with_snapshot: bool, refused_by: str
) -> None:
    """The judge's first look reads headers; qemu also reads the tables: a data cluster's
    offset that is not cluster-aligned in an L2 table makes it refuse the image as corrupt.
    A qcow2 with an internal snapshot is converted by libvirt, whose qemu-img refuses it on
    the host; a plain one goes up into the disk's own volume, and the judge finds it as the
    bytes pass. Either way nothing stays: no disk, no temporary, no landing mark."""
    site = pvc_site
    _image_of(site, tmp_path, "qcow2")
    if with_snapshot:
        qemu_snapshot = ["qemu-img", "snapshot", "-c", "s", str(tmp_path / "disk.qcow2")]
        subprocess.run(qemu_snapshot, check=True)
    image = bytearray((tmp_path / "disk.qcow2").read_bytes())
    (l1_offset,) = struct.unpack_from(">Q", image, 40)
    (l1_entry,) = struct.unpack_from(">Q", image, l1_offset)
    l2_offset = l1_entry & OFFSET_MASK
    (l2_entry,) = struct.unpack_from(">Q", image, l2_offset)
    struct.pack_into(">Q", image, l2_offset, l2_entry + 512)  # the first cluster, misaligned
    site.staged.put("corrupt.qcow2", bytes(image))
    before = site.volume_names()

    refused = site.import_("corrupt.qcow2", "xfer-corrupt")

    assert error_of(refused).kind is ErrorKind.INVALID_SPEC
    assert refused_by in error_of(refused).message
    assert site.volume_names() == before


def test_a_plain_qcow2_is_the_disk_as_staged_and_one_with_snapshots_is_converted(
    pvc_site: Site, tmp_path: Path
) -> None:
    """A plain qcow2 goes up one stream into the disk's own volume, so the disk is the
    staged bytes; a qcow2 with an internal snapshot is converted by libvirt, which keeps
    only the current state. Neither leaves a temporary or a landing mark."""
    site = pvc_site
    before = site.volume_names()
    plain = _image_of(site, tmp_path, "qcow2")
    site.staged.put("plain.qcow2", plain)
    as_staged = ok(site.import_("plain.qcow2", "xfer-plain"))
    landed = b"".join(volume_chunks(site.conn, site.conn.storageVolLookupByPath(as_staged.path)))
    assert landed == plain

    subprocess.run(["qemu-img", "snapshot", "-c", "s", str(tmp_path / "disk.qcow2")], check=True)
    site.staged.put("snapshots.qcow2", (tmp_path / "disk.qcow2").read_bytes())
    converted = ok(site.import_("snapshots.qcow2", "xfer-snapshots"))
    info = json.loads(
        subprocess.run(
            ["qemu-img", "info", "-U", "--output=json", converted.path],
            check=True,
            capture_output=True,
        ).stdout
    )
    assert "snapshots" not in info
    assert info["virtual-size"] == BASE_BYTES

    records = {
        f"{name}.qcow2{suffix}"
        for name in ("xfer-plain", "xfer-snapshots")
        for suffix in ("", RECORD)
    }
    assert site.volume_names() == before | records
    copy = site.vm("xfer-from-plain", as_staged.path, "qcow2")
    ok(site.export(copy, "plain.raw", "raw"))
    assert site.staged.stored("plain.raw") == site.content


def test_an_import_cut_off_in_place_is_unavailable_until_the_sweep_removes_it(
    pvc_site: Site, tmp_path: Path
) -> None:
    """What a provider killed while writing a disk in place leaves: the disk's volume, part
    written, and its landing mark. An import of the name is UNAVAILABLE (never answered
    with the partial disk, never a clash); the sweep removes both once they are old."""
    site = pvc_site
    pool = site.conn.storagePoolLookupByName(POOL)
    mark = TransferVolumes(owner=TRANSFER_OWNER, clock=ManualClock()).landing_mark()
    for name, content in (
        ("xfer-cut.qcow2.pyrigaud-landing.json", mark),
        ("xfer-cut.qcow2", b"QFI\xfb"),
    ):
        volume = pool.createXML(volume_xml(name, len(content), volume_format="raw"), 0)
        upload_volume(site.conn, volume, (content,))
    site.staged.put("whole.qcow2", _image_of(site, tmp_path, "qcow2"))
    left = site.volume_names()

    refused = site.import_("whole.qcow2", "xfer-cut")

    assert error_of(refused).kind is ErrorKind.UNAVAILABLE
    assert "has not finished" in error_of(refused).message
    assert site.volume_names() == left
    assert site.backend.transfer_leftovers is not None
    assert ok(site.backend.transfer_leftovers.sweep_transfer_leftovers(60.0)) == ()
    swept = ok(site.backend.transfer_leftovers.sweep_transfer_leftovers(0.0))
    assert {"xfer-cut.qcow2", "xfer-cut.qcow2.pyrigaud-landing.json"} <= set(swept)
    ok(site.import_("whole.qcow2", "xfer-cut"))


@pytest.fixture
def s3_site(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Site]:
    """The site on S3 only (its credentials are what the test changes)."""
    yield from _site("s3", request, tmp_path / "migration-storage")


def test_refused_s3_credentials_are_permission_denied_and_leave_nothing(s3_site: Site) -> None:
    site = s3_site
    source = site.vm("xfer-denied")
    ok(site.export(source, "d.qcow2"))
    before = site.volume_names()
    site.staged.credentials = {**site.staged.credentials, "secretAccessKey": "wrong-secret"}

    exported = site.export(source, "d2.qcow2")
    imported = site.import_("d.qcow2", "xfer-denied")

    for refused in (exported, imported):
        assert error_of(refused).kind is ErrorKind.PERMISSION_DENIED
        assert "wrong-secret" not in error_of(refused).message
    assert site.volume_names() == before
    assert site.staged.stored("d2.qcow2") is None


def test_the_state_at_a_snapshot_is_exported_not_what_came_after(
    site: Site, tmp_path: Path
) -> None:
    """The manager exports at the snapshot it took: that state, flattened over the base image,
    whatever was written to the disk since."""
    source = site.vm("xfer-snap")
    assert site.backend.snapshots is not None
    taken = ok(site.backend.snapshots.create_snapshot(SnapshotRequest(vm_id=source, name="mig")))
    disk = ok(site.backend.disk_transfer.disk_details(DiskQuery(vm_id=source)))
    written = subprocess.run(
        ["qemu-io", "-c", "write -P 0x55 0 1M", disk.path], capture_output=True, check=False
    )
    assert written.returncode == 0, written.stderr
    before = site.volume_names()

    raw = ok(site.export(source, "snap.raw", "raw", snapshot_id=taken.id))
    assert site.staged.stored("snap.raw") == site.content
    assert raw.checksum == _sha256(site.content)
    ok(site.export(source, "snap.qcow2", "qcow2", snapshot_id=taken.id))
    staged = site.staged.stored("snap.qcow2")
    assert staged is not None
    image = tmp_path / "snap.qcow2"
    image.write_bytes(staged)
    subprocess.run(
        ["qemu-img", "convert", "-O", "raw", str(image), str(tmp_path / "snap.raw")],
        capture_output=True,
        check=True,
    )
    assert (tmp_path / "snap.raw").read_bytes() == site.content
    now = ok(site.export(source, "now.raw", "raw"))
    assert now.checksum != raw.checksum  # the write after the snapshot is in the current state
    assert site.volume_names() == before, "the flattened backing made for the export was kept"
    missing = site.export(source, "none.raw", "raw", snapshot_id="no-such")
    assert error_kind(missing) is ErrorKind.NOT_FOUND


# Where the room runs out, and whether the export is at a snapshot: at a snapshot qemu-img
# makes the image in the PVC's own file, from the volumes downloaded into scratch files;
# powered off, the stream writes it to the PVC (and no scratch file is made).
FULL_PLACES = [("pvc", True), ("pvc", False), ("scratch", True)]


@pytest.fixture(params=FULL_PLACES, ids=["pvc-at-a-snapshot", "pvc-powered-off", "scratch"])
def full_site(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Site, bool]]:
    """The PVC site with 4 MiB of room in the PVC or the scratch directory, too little for the
    base's 36 MiB of random bytes; and whether to export at a snapshot."""
    full, at_snapshot = request.param
    with small_filesystem(4 * 1024**2) as small:
        if full == "pvc":
            sites = _site("pvc", request, small)
        else:
            sites = _site("pvc", request, tmp_path / "migration-storage", scratch_dir=small)
        try:
            yield next(sites), at_snapshot
        finally:
            sites.close()


def test_an_export_with_no_room_left_is_resource_exhausted_and_leaves_nothing(
    full_site: tuple[Site, bool],
) -> None:
    """A full PVC or scratch directory is the pod's resource exhausted (not the snapshot's
    fault), whichever writer finds it full, this process or qemu-img: nothing is staged, no
    temporary kept, no volume left."""
    site, at_snapshot = full_site
    source = site.vm("xfer-full")
    snapshot_id = ""
    if at_snapshot:
        assert site.backend.snapshots is not None
        request = SnapshotRequest(vm_id=source, name="mig")
        snapshot_id = ok(site.backend.snapshots.create_snapshot(request)).id
    before = site.volume_names()

    full = error_of(site.export(source, "full.qcow2", snapshot_id=snapshot_id))

    assert full.kind is ErrorKind.RESOURCE_EXHAUSTED
    assert "No space left on device" in full.message
    assert site.staged.stored("full.qcow2") is None
    assert site.staged.case.leftovers() == []
    assert site.volume_names() == before


def _sha256_of_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(4 * 1024**2):
            digest.update(chunk)
    return digest.hexdigest()


def _staged_as_raw(site: Site, name: str, tmp_path: Path) -> Path:
    """The staged object `name`, read by qemu-img into a raw file."""
    staged = tmp_path / name
    staged.write_bytes(site.staged.stored(name) or b"")
    as_raw = tmp_path / f"{name}.as.raw"
    subprocess.run(
        ["qemu-img", "convert", "-O", "raw", str(staged), str(as_raw)],
        check=True,
        capture_output=True,
    )
    return as_raw


def _qemu_io(path: str, command: str) -> None:
    written = subprocess.run(["qemu-io", "-c", command, path], capture_output=True, check=False)
    assert written.returncode == 0, written.stderr


@pytest.mark.parametrize("disk_format", ["raw", "qcow2"])
def test_a_snapshot_of_a_disk_grown_past_an_odd_sized_base_exports_as_qemu_reads_it(
    pvc_site: Site, tmp_path: Path, disk_format: str
) -> None:
    """What Create makes (an image grown to the class's disk size) at the snapshot the manager
    takes: bit for bit `qemu-img convert -l snapshot.name=...` of the chain, the base's last
    bytes and the data written across its end included."""
    site = pvc_site
    odd = 9 * 1024**2 + 4097
    pool = site.conn.storagePoolLookupByName(POOL)
    base = pool.createXML(volume_xml("xfer-odd-base.raw", odd, volume_format="raw"), 0)
    upload_volume(site.conn, base, [os.urandom(odd)])
    grown = VMClass(cpu=1, memory_mib=256, disk_defaults=DiskDefaults(size_gib=1))
    request = CreateRequest(
        name=f"xfer-odd-{disk_format}",
        vm_class=grown,
        image=VMImage(path=str(base.path()), format="raw"),
    )
    source = ok(site.backend.lifecycle.start_create(request, OWNER)).id
    overlay = ok(site.backend.disk_transfer.disk_details(DiskQuery(vm_id=source))).path
    _qemu_io(overlay, f"write -P 0x5a {odd - 1000} 8k")  # across the base's end
    _qemu_io(overlay, "write -P 0x6b 512M 4k")
    assert site.backend.snapshots is not None
    taken = ok(site.backend.snapshots.create_snapshot(SnapshotRequest(vm_id=source, name="mig")))
    _qemu_io(overlay, "write -P 0x33 0 1M")  # after the snapshot: not in the export

    exported = ok(site.export(source, f"odd.{disk_format}", disk_format, snapshot_id=taken.id))

    expected = tmp_path / "expected.raw"
    subprocess.run(
        [
            *("qemu-img", "convert", "-l", "snapshot.name=mig", "-O", "raw"),
            *(overlay, str(expected)),
        ],
        check=True,
        capture_output=True,
    )
    staged = tmp_path / f"staged.{disk_format}"
    staged.write_bytes(site.staged.stored(f"odd.{disk_format}") or b"")
    assert exported.checksum == _sha256_of_file(staged)
    as_raw = tmp_path / "staged-as.raw"
    subprocess.run(
        ["qemu-img", "convert", "-O", "raw", str(staged), str(as_raw)],
        check=True,
        capture_output=True,
    )
    assert _sha256_of_file(as_raw) == _sha256_of_file(expected)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("corpus")


@pytest.mark.parametrize("name", sorted(VALID))
def test_every_image_kind_lands_as_the_disk_qemu_reads_from_it(
    pvc_site: Site, corpus: Path, name: str
) -> None:
    """The corpus's valid images imported, a VM made on each, its disk exported as raw: the
    disk is what `qemu-img convert -O raw` reads from the staged image."""
    site, image = pvc_site, valid_image(name, corpus)
    site.staged.put(image.path.name, image.path.read_bytes())
    imported = ok(site.import_(image.path.name, f"corpus-{name}"))
    copy = site.vm(f"corpus-{name}", imported.path, "qcow2")
    ok(site.export(copy, f"{name}.out.raw", "raw"))
    exported = site.staged.stored(f"{name}.out.raw")
    oracle = oracle_raw(image, corpus)
    assert exported is not None
    assert exported[: len(oracle)] == oracle
    assert not exported[len(oracle) :].strip(b"\0")


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_image_is_refused_and_leaves_nothing_in_the_pool(
    pvc_site: Site, corpus: Path, name: str
) -> None:
    site, image = pvc_site, hostile_image(name, corpus)
    site.staged.put(image.path.name, image.path.read_bytes())
    before = site.volume_names()

    refused = site.import_(image.path.name, f"hostile-{name}")

    assert error_kind(refused) is ErrorKind.INVALID_SPEC, refused
    assert error_of(refused).message.startswith("source_url: ")
    assert site.volume_names() == before


def test_an_export_at_a_snapshot_with_later_ones_says_they_stay_behind(
    pvc_site: Site, caplog: pytest.LogCaptureFixture
) -> None:
    site = pvc_site
    vm_id = site.vm("xfer-later")
    assert site.backend.snapshots is not None
    first = ok(site.backend.snapshots.create_snapshot(SnapshotRequest(vm_id=vm_id, name="first")))
    second = ok(site.backend.snapshots.create_snapshot(SnapshotRequest(vm_id=vm_id, name="second")))
    with caplog.at_level(logging.WARNING):
        ok(site.export(vm_id, "later.qcow2", snapshot_id=first.id))
    assert "later_snapshots" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        ok(site.export(vm_id, "last.qcow2", snapshot_id=second.id))
    assert "later_snapshots" not in caplog.text


def _sparse_file(path: Path, size: int, data: dict[int, bytes]) -> bytes:
    """A file of `size` bytes holding `data` at its offsets and holes elsewhere; its content."""
    content = bytearray(size)
    with path.open("wb") as file:
        file.truncate(size)
        for offset, chunk in data.items():
            file.seek(offset)
            file.write(chunk)
            content[offset : offset + len(chunk)] = chunk
    return bytes(content)


def test_holes_in_a_volume_are_skipped_by_the_stream_yet_read_as_zeros(
    pvc_site: Site, tmp_path: Path
) -> None:
    """A mostly empty raw base (data across the 8 MiB ranges downloads stream, holes
    between, a size in no whole MiB): libvirt sends its holes as holes, not zeros, and every
    export reads it byte for byte, at a snapshot too."""
    site = pvc_site
    size = 20 * 1024**2 + 4097
    mib = 1024**2
    content = _sparse_file(
        POOL_PATH / "xfer-sparse-base.raw",
        size,
        {0: os.urandom(4096), 7 * mib + mib // 2: os.urandom(mib), size - 4097: os.urandom(4097)},
    )
    pool = site.conn.storagePoolLookupByName(POOL)
    pool.refresh(0)
    base = pool.storageVolLookupByName("xfer-sparse-base.raw")

    chunks = list(volume_chunks(site.conn, base))
    assert b"".join(chunks) == content
    assert any(chunk is ZEROS for chunk in chunks), "the holes came as data"

    source = site.vm("xfer-sparse", path=str(base.path()))
    off = ok(site.export(source, "sparse.raw", "raw"))
    # The VM's disk is an overlay qemu made a little larger: zeros after the base's end.
    grown = content + bytes(-size % 1024)
    assert site.staged.stored("sparse.raw") == grown
    assert off.checksum == _sha256(grown)
    assert site.backend.snapshots is not None
    taken = ok(site.backend.snapshots.create_snapshot(SnapshotRequest(vm_id=source, name="mig")))
    ok(site.export(source, "sparse-snap.qcow2", snapshot_id=taken.id))
    assert _staged_as_raw(site, "sparse-snap.qcow2", tmp_path).read_bytes() == grown


def test_a_snapshot_of_a_vm_grown_from_a_qcow2_image_exports_as_qemu_reads_the_chain(
    pvc_site: Site, tmp_path: Path
) -> None:
    """A VM grown from a qcow2 image (a cloud image): the image is read as it is, not
    flattened first, and the export is the chain at the snapshot as qemu reads it."""
    site = pvc_site
    raw = tmp_path / "image.raw"
    raw.write_bytes(site.content)
    image = POOL_PATH / "xfer-image.qcow2"
    subprocess.run(
        ["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw), str(image)],
        check=True,
        capture_output=True,
    )
    site.conn.storagePoolLookupByName(POOL).refresh(0)
    source = site.vm("xfer-from-qcow2", path=str(image), image_format="qcow2")
    overlay = ok(site.backend.disk_transfer.disk_details(DiskQuery(vm_id=source))).path
    _qemu_io(overlay, "write -P 0x5a 1M 64k")
    assert site.backend.snapshots is not None
    taken = ok(site.backend.snapshots.create_snapshot(SnapshotRequest(vm_id=source, name="mig")))
    _qemu_io(overlay, "write -P 0x33 0 1M")  # after the snapshot: not in the export
    pool_changed = POOL_PATH.stat().st_mtime_ns  # a volume made or removed changes it

    ok(site.export(source, "from-qcow2.qcow2", snapshot_id=taken.id))
    assert POOL_PATH.stat().st_mtime_ns == pool_changed, "the image was flattened into a copy"

    expected = tmp_path / "expected.raw"
    subprocess.run(
        [
            *("qemu-img", "convert", "-l", "snapshot.name=mig", "-O", "raw"),
            *(overlay, str(expected)),
        ],
        check=True,
        capture_output=True,
    )
    as_raw = _staged_as_raw(site, "from-qcow2.qcow2", tmp_path)
    assert _sha256_of_file(as_raw) == _sha256_of_file(expected)
