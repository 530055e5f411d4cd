"""Hostile images against a running provider, as the manager calls it: every one of the corpus's
crafted images staged on a PVC is refused by ImportDisk with INVALID_ARGUMENT inside a 2 s
deadline (the bound the provider promises), the server's resident memory grows by less than
128 MiB over all of them, and it answers on afterwards.

vSphere is where the pod itself judges and converts every staged image (qemu-img under process
limits), so its server process is the one whose bounds matter.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb

from support.image_corpus import HOSTILE, hostile_image, valid_image
from support.replica import Replica
from support.vsphere import Simulator

PVC = "mig"
DEADLINE_SECONDS = 2.0
MAX_EXTRA_RSS_BYTES = 128 * 1024**2


@pytest.fixture
def staging(tmp_path: Path) -> Path:
    root = tmp_path / "migration-storage"
    (root / PVC).mkdir(parents=True)
    return root


@pytest.fixture
def replica(simulator: Simulator, staging: Path, tmp_path: Path) -> Iterator[Replica]:
    served = Replica(
        simulator.serve_environ(
            PROVIDER_DEFAULT_DATASTORE="LocalDS_0",
            PYRIGAUD_MIGRATION_STORAGE_ROOT=str(staging),
        ),
        tmp_path / "serve",
    )
    try:
        yield served
    finally:
        served.stop()


def _memory_kib(pid: int, field: str) -> int:
    """A VmRSS or VmHWM (peak) line of the process's status, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for process {pid}")


def _import(replica: Replica, staging: Path, image: Path, target: str) -> grpc.StatusCode:
    shutil.copyfile(image, staging / PVC / image.name)
    request = pb.ImportDiskRequest(
        source_url=f"pvc://{PVC}/{image.name}",
        format="qcow2",
        target_name=target,
        backend_type="pvc",
        transfer_mode="relay",
    )
    try:
        replica.stub.ImportDisk(request, timeout=DEADLINE_SECONDS)
    except grpc.RpcError as error:
        return error.code()
    return grpc.StatusCode.OK


def test_every_hostile_image_is_refused_in_time_and_bounded_memory(
    replica: Replica, staging: Path, tmp_path: Path
) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    # A valid import first: what every import loads (the judge, qemu-img's first run) is in.
    warm = valid_image("qcow2-v3", corpus).path
    assert _import(replica, staging, warm, "served-hostile-warm-up") is grpc.StatusCode.OK
    baseline = _memory_kib(replica.pid, "VmRSS")
    codes = {
        name: _import(replica, staging, hostile_image(name, corpus).path, f"served-hostile-{name}")
        for name in sorted(HOSTILE)
    }
    assert codes == dict.fromkeys(sorted(HOSTILE), grpc.StatusCode.INVALID_ARGUMENT)
    assert (_memory_kib(replica.pid, "VmHWM") - baseline) * 1024 < MAX_EXTRA_RSS_BYTES
    assert replica.stub.Validate(pb.ValidateRequest(), timeout=10).ok
