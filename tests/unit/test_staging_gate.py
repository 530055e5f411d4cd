"""Where a request may aim the staging stores' connections: the rule on addresses (no address
outside loopback is ever dialled to prove a refusal), the gate on locations, and a refused
store reached not even once."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyrigaud.adapters.hypervisors.fake.backend import fake_backend
from pyrigaud.adapters.hypervisors.fake.hypervisor import FakeHypervisor
from pyrigaud.adapters.staging.gate import ResolvingGate
from pyrigaud.adapters.staging.nfs_location import NFS
from pyrigaud.adapters.staging.pvc_location import PVC
from pyrigaud.adapters.staging.registry import STAGING_TYPES
from pyrigaud.adapters.staging.s3_location import S3
from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.models import CreateRequest, OwnerMark, VMClass, VMImage
from pyrigaud.domain.staging import StagedLocation, StagingType
from pyrigaud.domain.staging_gate import StagingGate
from pyrigaud.entrypoints.grpc.wire.field_names import for_the_manager

import support.transfer as transfers
from support import ManualClock, error_of, ok

CREDENTIALS = {"accessKeyID": "id", "secretAccessKey": "secret"}


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        ("169.254.169.254", "metadata"),
        ("fd00:ec2::254", "metadata"),
        ("::ffff:169.254.169.254", "metadata"),
        ("169.254.10.1", "link-local"),
        ("fe80::1", "link-local"),
        ("224.0.0.251", "not a host address"),
        ("0.0.0.0", "not a host address"),
        ("::", "not a host address"),
        ("127.0.0.1", "PYRIGAUD_STAGING_ALLOW_LOOPBACK"),
        ("::1", "PYRIGAUD_STAGING_ALLOW_LOOPBACK"),
    ],
)
def test_addresses_no_request_may_aim_at_are_refused(address: str, problem: str) -> None:
    refusal = StagingGate().refusal(address)
    assert refusal is not None
    assert problem in refusal


@pytest.mark.parametrize("address", ["10.0.0.9", "192.168.7.1", "172.16.0.4", "2001:db8::5"])
def test_on_premises_stores_are_allowed_by_default(address: str) -> None:
    assert StagingGate().refusal(address) is None


def test_loopback_is_allowed_only_when_the_operator_says() -> None:
    assert StagingGate(allow_loopback=True).refusal("127.0.0.1") is None
    assert StagingGate(allow_loopback=True).refusal("169.254.169.254") is not None


def test_an_allow_list_keeps_every_other_address_out() -> None:
    gate = StagingGate(allowed_networks=("10.20.0.0/16", "192.168.1.7"))
    assert gate.refusal("10.20.3.4") is None
    assert gate.refusal("192.168.1.7") is None
    refusal = gate.refusal("192.168.1.8")
    assert refusal is not None
    assert "PYRIGAUD_STAGING_ALLOWED_HOSTS" in refusal
    assert gate.refusal("169.254.169.254") is not None  # never, list or not


def _location(backend: StagingType, url: str, options: dict[str, object]) -> StagedLocation:
    credentials = CREDENTIALS if backend is S3 else {}
    return ok(STAGING_TYPES.parse_location("destination_url", url, backend, options, credentials))


@pytest.mark.parametrize(
    ("backend", "url", "options", "field"),
    [
        (
            S3,
            "s3://mig/x.qcow2",
            {"bucket": "mig", "endpoint": "http://169.254.169.254"},
            "storage_options_json.endpoint",
        ),
        (
            S3,
            "s3://mig/x.qcow2",
            {"bucket": "mig", "endpoint": "https://localhost:9000"},
            "storage_options_json.endpoint",
        ),
        (
            NFS,
            "nfs://127.0.0.1/export/x.qcow2",
            {"server": "127.0.0.1", "export": "/export"},
            "storage_options_json.server",
        ),
    ],
)
def test_a_refused_store_is_permission_denied_naming_the_option(
    backend: StagingType, url: str, options: dict[str, object], field: str
) -> None:
    refused = error_of(ResolvingGate(StagingGate()).admitted(_location(backend, url, options)))
    assert refused.kind is ErrorKind.PERMISSION_DENIED
    assert for_the_manager(refused).startswith(f"{field}: ")
    assert "nothing was sent there" in refused.message


def test_an_admitted_store_is_pinned_to_the_address_that_was_checked() -> None:
    gate = ResolvingGate(StagingGate(allow_loopback=True))
    s3 = _location(S3, "s3://mig/x", {"bucket": "mig", "endpoint": "http://localhost:9000"})
    assert ok(gate.admitted(s3)).address == "127.0.0.1"  # IPv4 first, where a name has both
    pvc = _location(PVC, "pvc://mig/x", {})
    assert ok(gate.admitted(pvc)) == pvc  # a mounted folder: nothing to reach


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A loopback port that notes any connection (none may come)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        server.settimeout(0.5)
        yield server


def test_a_store_on_a_refused_address_is_not_reached_even_once(
    listener: socket.socket, tmp_path: Path
) -> None:
    port = listener.getsockname()[1]
    fake = FakeHypervisor(ManualClock())
    fake.add_image("/images/base.qcow2")
    backend = fake_backend(fake)
    request = CreateRequest(
        name="gated",
        vm_class=VMClass(cpu=1, memory_mib=256),
        image=VMImage(path="/images/base.qcow2"),
    )
    vm_id = ok(backend.lifecycle.start_create(request, OwnerMark(provider="tests/gate"))).id
    loopback_refused = ResolvingGate(StagingGate())
    refused = transfers.export_disk(
        transfers.disk_moves(backend, tmp_path, storage_gate=loopback_refused),
        vm_id,
        "s3://mig/vmmigrations/ns/m/x.qcow2",
        backend="s3",
        options={"bucket": "mig", "endpoint": f"http://127.0.0.1:{port}", "usePathStyle": True},
        credentials=CREDENTIALS,
    )
    assert error_of(refused).kind is ErrorKind.PERMISSION_DENIED
    with pytest.raises(TimeoutError):
        listener.accept()
