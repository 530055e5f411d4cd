"""/metrics on a real health server, scraped over HTTP after real RPCs, parsed like Prometheus."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from pyrigaud.adapters.hypervisors.fake.hypervisor import FakeHypervisor
from pyrigaud.domain.errors import ProviderError
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2_grpc as pb_grpc
from pyrigaud.entrypoints.http.health import HealthServer, Readiness

from support import TickingClock
from support.e2e import create_vm, start_provider


@dataclass
class Served:
    stub: pb_grpc.ProviderStub
    fake: FakeHypervisor
    health_port: int

    def get(self, path: str, accept: str = "") -> tuple[int, str, str]:
        url = f"http://127.0.0.1:{self.health_port}{path}"
        request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, response.headers["Content-Type"], response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.headers["Content-Type"], error.read().decode()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    """The gRPC server and the health server sharing one Metrics, as `pyrigaud serve` does
    (PVC `mig` mounted for disk transfers)."""
    (tmp_path / "mig").mkdir()
    # Transfers are timed on the provider's clock: each reading of it takes a millisecond.
    running = start_provider(
        {"PYRIGAUD_MIGRATION_STORAGE_ROOT": str(tmp_path)}, clock=TickingClock()
    )
    try:
        yield Served(running.stub, running.fake, running.application.health_port)
    finally:
        running.channel.close()
        running.application.stop(0)


def scrape(served: Served) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    status, content_type, body = served.get("/metrics")
    assert status == 200
    assert content_type.startswith("text/plain; version=0.0.4")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }


def test_scrape_after_rpcs_shows_rpcs_and_hypervisor_calls(served: Served) -> None:
    vm_id = create_vm(served.stub, "metrics-1")
    served.stub.Describe(pb.DescribeRequest(id=vm_id), timeout=5)
    with pytest.raises(grpc.RpcError):
        served.stub.Power(pb.PowerRequest(id="missing", op=pb.POWER_OP_ON), timeout=5)
    served.fake.faults.fail("check", ProviderError.unavailable("host down"), times=1)
    assert not served.stub.Validate(pb.ValidateRequest(), timeout=5).ok

    samples = scrape(served)

    def value(name: str, **labels: str) -> float | None:
        return samples.get((name, frozenset(labels.items())))

    assert value("pyrigaud_rpc_requests_total", method="Create", code="OK") == 1
    assert value("pyrigaud_rpc_requests_total", method="Describe", code="OK") == 1
    assert value("pyrigaud_rpc_requests_total", method="Power", code="NOT_FOUND") == 1
    assert value("pyrigaud_rpc_requests_total", method="Validate", code="OK") == 1
    assert value("pyrigaud_rpc_duration_seconds_count", method="Create") == 1
    assert value("pyrigaud_rpc_duration_seconds_bucket", method="Create", le="+Inf") == 1
    assert value("pyrigaud_hypervisor_calls_total", operation="start_create", outcome="ok") == 1
    assert value("pyrigaud_hypervisor_calls_total", operation="check", outcome="unavailable") == 1
    assert value("pyrigaud_hypervisor_call_duration_seconds_count", operation="describe") == 1
    assert value("pyrigaud_inflight_rpcs") == 0
    assert value("pyrigaud_inflight_mutations") == 0


def test_disk_transfers_show_their_bytes_durations_and_where_the_failed_ones_failed(
    served: Served,
) -> None:
    vm_id = create_vm(served.stub, "metrics-transfer")
    exported = served.stub.ExportDisk(
        pb.ExportDiskRequest(
            vm_id=vm_id,
            destination_url="pvc://mig/m.qcow2",
            backend_type="pvc",
            transfer_mode="relay",
        ),
        timeout=5,
    )
    with pytest.raises(grpc.RpcError):
        served.stub.ImportDisk(
            pb.ImportDiskRequest(
                source_url="pvc://mig/m.qcow2",
                target_name="metrics-in",
                verify_checksum=True,
                expected_checksum="0" * 64,
                backend_type="pvc",
                transfer_mode="relay",
            ),
            timeout=5,
        )

    samples = scrape(served)

    def value(name: str, **labels: str) -> float | None:
        return samples.get((name, frozenset(labels.items())))

    export = {"backend": "fake", "storage": "pvc", "direction": "export"}
    imports = {**export, "direction": "import"}
    assert value("pyrigaud_transfer_bytes_total", **export) == exported.estimated_size_bytes
    assert value("pyrigaud_transfer_bytes_total", **imports) == exported.estimated_size_bytes
    assert value("pyrigaud_transfers_in_flight", **export) == 0
    assert value("pyrigaud_transfer_duration_seconds_count", **export) == 1
    assert value("pyrigaud_transfer_duration_seconds_count", **imports) == 1
    assert value("pyrigaud_transfer_throughput_bytes_per_second_count", **export) == 1
    assert value("pyrigaud_transfer_throughput_bytes_per_second_count", **imports) == 0
    assert value("pyrigaud_transfer_failures_total", **imports, phase="verify") == 1
    assert value("pyrigaud_transfer_failures_total", **export, phase="open") == 0


def test_prometheus_asking_for_openmetrics_gets_it(served: Served) -> None:
    create_vm(served.stub, "metrics-om")
    status, content_type, body = served.get(
        "/metrics", accept="application/openmetrics-text;version=1.0.0,text/plain;q=0.5"
    )
    assert status == 200
    assert content_type.startswith("application/openmetrics-text")
    families = {family.name: family for family in openmetrics_families(body)}
    created = [
        sample
        for sample in families["pyrigaud_rpc_requests"].samples
        if sample.name == "pyrigaud_rpc_requests_total"
    ]
    # Every other series is there from the start, at 0.
    assert [(sample.labels, sample.value) for sample in created if sample.value] == [
        ({"method": "Create", "code": "OK"}, 1)
    ]


def test_probes_are_unchanged_next_to_metrics(served: Served) -> None:
    assert served.get("/healthz")[::2] == (200, "ok")
    assert served.get("/readyz")[::2] == (200, "ready")  # serving, as `pyrigaud serve` is
    assert served.get("/nothing")[::2] == (404, "not found")


def test_without_metrics_there_is_no_metrics_page() -> None:
    health = HealthServer("127.0.0.1", 0, Readiness("fake"))
    health.start()
    try:
        url = f"http://127.0.0.1:{health.port}/metrics"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=5)
        assert refused.value.code == 404
    finally:
        health.stop()
