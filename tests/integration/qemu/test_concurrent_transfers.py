"""Two dozen imports and exports into one libvirt pool at once, on real libvirtd + QEMU.

What it reproduces: with many migrations started together, imports answered UNIMPLEMENTED
("storage pool ... did not recognise the staged qcow2 image") though the same images one at a
time landed. libvirtd refuses to refresh a pool while any volume of it is being built (another
import's conversion, an export's flattened copy), and the landing read the format of the
image it had just uploaded into a raw placeholder from a pool view that refused refresh had
left stale: raw. Here every valid kind of image is imported while VMs' disks are exported
from the same pool, all started together behind a barrier so that uploads end while
conversions run; each must succeed, and each disk must hold what qemu-img reads from its
source, bytes compared.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pyrigaud.adapters.hypervisors.libvirt.connection import LibvirtConnection
from pyrigaud.adapters.hypervisors.libvirt.storage import (
    PoolSettings,
    volume_facts,
)
from pyrigaud.application.backend import Backend
from pyrigaud.domain.models import CreateRequest, OwnerMark, VMClass, VMImage

from support import ManualClock, ok
from support.at_once import all_at_once, holds
from support.disk_image import qemu_reading
from support.image_corpus import VALID, oracle_raw, staged_valid_images
from support.libvirt import libvirt_test_backend
from support.qemu import QEMU_URI, open_qemu, random_base_volume, remove_pool_leftovers
from support.staging import StagingCase, migration_name, pvc_case
from support.transfer import DiskMoves, disk_moves, export_disk, import_disk

POOL = "pyrigaud-concurrent"
POOL_PATH = Path("/var/lib/pyrigaud-test/concurrent")
BASE_BYTES = 16 * 1024**2
AT_ONCE = 24  # transfers started together, as a manager migrating two dozen VMs starts them
EXPORTS = AT_ONCE - len(VALID)  # VMs whose disks go out while the corpus comes in
OWNER = OwnerMark(provider="tests/concurrent-transfers")


@dataclass
class Site:
    backend: Backend
    moves: DiskMoves
    conn: Any
    staged: StagingCase
    base: str  # a raw volume of random bytes
    content: bytes

    def put(self, name: str, content: bytes) -> None:
        writer = ok(self.staged.storage.open_write(self.staged.locate(name), len(content)))
        ok(writer.write(content))
        ok(writer.commit())


@pytest.fixture
def site(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Site]:
    conn = open_qemu()
    remove_pool_leftovers(conn, POOL, POOL_PATH)
    root = tmp_path / "migration-storage"
    base, content = random_base_volume(conn, POOL, POOL_PATH, "base.raw", BASE_BYTES)
    connection = LibvirtConnection(QEMU_URI)
    backend = libvirt_test_backend(
        connection,
        ManualClock(),
        domain_type="qemu",
        pools=PoolSettings(default_pool=POOL, default_pool_path=str(POOL_PATH)),
    )
    staged = pvc_case(root, migration_name(request))
    try:
        yield Site(backend, disk_moves(backend, root), conn, staged, base, content)
    finally:
        connection.close()
        remove_pool_leftovers(conn, POOL, POOL_PATH)
        conn.close()


def test_two_dozen_imports_and_exports_into_one_pool_at_once_move_the_right_bytes(
    site: Site, tmp_path: Path
) -> None:
    corpus = tmp_path / "corpus"
    images = staged_valid_images(site.put, corpus)
    sources = [
        ok(
            site.backend.lifecycle.start_create(
                CreateRequest(
                    name=f"out-{index}",
                    vm_class=VMClass(cpu=1, memory_mib=256),
                    image=VMImage(path=site.base, format="raw"),
                ),
                OWNER,
            )
        ).id
        for index in range(EXPORTS)
    ]

    def importing(name: str) -> Callable[[], Any]:
        url = site.staged.locate(images[name].path.name).url
        return lambda: import_disk(site.moves, url, target_name=f"in-{name}")

    def exporting(index: int) -> Callable[[], Any]:
        url = site.staged.locate(f"out-{index}.qcow2").url
        return lambda: export_disk(site.moves, sources[index], url)

    answers = all_at_once(
        [importing(name) for name in images] + [exporting(index) for index in range(EXPORTS)]
    )

    imported = dict(zip(images, answers[: len(images)], strict=True))
    for name, answer in imported.items():
        landed = ok(answer)
        facts = volume_facts(site.conn, landed.path)
        assert facts is not None
        assert facts.format == "qcow2", f"{name} landed as {facts.format}"
        reading = qemu_reading(landed.path, "qcow2", tmp_path / f"in-{name}.raw")
        assert holds(reading, oracle_raw(images[name], corpus)), f"{name} landed other bytes"
    for index, answer in enumerate(answers[len(images) :]):
        ok(answer)
        staged = tmp_path / f"out-{index}.qcow2"
        stored = site.staged.stored(site.staged.locate(f"out-{index}.qcow2"))
        assert stored is not None
        staged.write_bytes(stored)
        reading = qemu_reading(staged, "qcow2", tmp_path / f"out-{index}.raw")
        assert holds(reading, site.content), f"export {index} sent other bytes"
