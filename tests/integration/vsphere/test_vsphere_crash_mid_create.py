"""A `pyrigaud serve` on vSphere killed with SIGKILL in the middle of a Create.

The simulator finishes each task inside its SOAP call, so the test holds one later step of the
Create open: the launcher delays UpgradeVM_Task (asked for by the class's hardware version),
which runs after the clone and before the reconfigure that clears the building mark. The test
kills the provider as soon as the clone exists; the next process's start-up sweep must remove it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb

from replica_support import Replica
from vsphere_support import TEMPLATE_VM, Simulator, running_simulator

HELD_STEP = "UpgradeVM_Task"
HELD_MILLISECONDS = 4000
NAME = "crash-vsphere"
SETTLE_SECONDS = 60


@pytest.fixture
def slow_upgrades() -> Iterator[Simulator]:
    with running_simulator("-method-delay", f"{HELD_STEP}={HELD_MILLISECONDS}") as simulator:
        yield simulator


def environ(simulator: Simulator, **extra: str) -> dict[str, str]:
    return {
        "PROVIDER_TYPE": "vsphere",
        "PROVIDER_ENDPOINT": simulator.endpoint,
        "TLS_INSECURE_SKIP_VERIFY": "true",
        "PYRIGAUD_CREDENTIALS": "env",
        "PYRIGAUD_CREDENTIAL_USERNAME": simulator.username,
        "PYRIGAUD_CREDENTIAL_PASSWORD": simulator.password,
        "PROVIDER_NAMESPACE": "ns",
        "PROVIDER_NAME": "crash",
        **extra,
    }


def test_a_create_killed_part_way_is_swept_by_the_next_process(
    slow_upgrades: Simulator, tmp_path: Path
) -> None:
    watcher = slow_upgrades.adapter()
    replica = Replica(environ(slow_upgrades), tmp_path / "killed")
    request = pb.CreateRequest(
        name=NAME,
        class_json=json.dumps(
            {"CPU": 1, "MemoryMiB": 256, "ExtraConfig": {"vsphere.hardwareVersion": "15"}}
        ),
        image_json=json.dumps({"TemplateName": TEMPLATE_VM}),
    )
    failures: list[grpc.RpcError] = []

    def create() -> None:
        try:
            replica.stub.Create(request, timeout=60)
        except grpc.RpcError as error:
            failures.append(error)

    caller = threading.Thread(target=create)
    caller.start()
    try:
        deadline = time.monotonic() + SETTLE_SECONDS
        while time.monotonic() < deadline and watcher.find_by_name(NAME).unwrap() is None:
            time.sleep(0.05)
    finally:
        replica.kill()  # the clone exists; the held upgrade keeps the Create from finishing
        caller.join(timeout=30)
    assert failures, "the Create finished before the provider was killed"
    leftover = watcher.find_by_name(NAME).unwrap()
    assert leftover is not None
    assert leftover.building_since is not None

    survivor = Replica(
        environ(slow_upgrades, PYRIGAUD_ABANDONED_AFTER_SECONDS="0"), tmp_path / "next"
    )
    try:
        deadline = time.monotonic() + SETTLE_SECONDS
        while time.monotonic() < deadline and watcher.find_by_name(NAME).unwrap() is not None:
            time.sleep(0.2)
        assert watcher.find_by_name(NAME).unwrap() is None
        assert f"leftover of a Create killed part-way: VM {NAME!r}" in (
            survivor.log_path.read_text()
        )
    finally:
        survivor.stop()
