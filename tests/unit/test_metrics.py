"""What the RPC interceptors and the port wrapper record, read back from the registry."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from returns.result import Failure, Success

from pyrigaud.adapters.clocks import SystemClock
from pyrigaud.adapters.hypervisors.fake.backend import fake_backend
from pyrigaud.adapters.hypervisors.fake.hypervisor import FakeHypervisor
from pyrigaud.application.timed_ports import instrument_backend
from pyrigaud.domain.errors import ProviderError
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2_grpc as pb_grpc
from pyrigaud.entrypoints.grpc.limits import MutationLimiter
from pyrigaud.entrypoints.metrics import (
    LATENCY_BUCKETS_SECONDS,
    Metrics,
    PrometheusHypervisorCounters,
    PrometheusTransfers,
)

from support import ManualClock, ok
from support.e2e import CLASS_JSON, start_provider


@dataclass
class Served:
    stub: pb_grpc.ProviderStub
    fake: FakeHypervisor


@contextmanager
def served_on_fake(metrics: Metrics, limiter: MutationLimiter | None = None) -> Iterator[Served]:
    """A real server on loopback, on the fake backend, recording into `metrics`."""
    overrides: dict[str, Any] = {"metrics": metrics}
    if limiter is not None:
        overrides["limiter"] = limiter
    running = start_provider(**overrides)
    try:
        yield Served(running.stub, running.fake)
    finally:
        running.channel.close()
        running.application.stop(0)


def code_of(call: Callable[..., object], request: object, timeout: float = 5) -> grpc.StatusCode:
    try:
        call(request, timeout=timeout)
    except grpc.RpcError as error:
        return error.code()
    return grpc.StatusCode.OK


def requests(metrics: Metrics, method: str, code: str) -> float | None:
    return metrics.registry.get_sample_value(
        "pyrigaud_rpc_requests_total", {"method": method, "code": code}
    )


def rpc_count(metrics: Metrics, method: str) -> float | None:
    return metrics.registry.get_sample_value(
        "pyrigaud_rpc_duration_seconds_count", {"method": method}
    )


def calls(metrics: Metrics, operation: str, outcome: str) -> float | None:
    return metrics.registry.get_sample_value(
        "pyrigaud_hypervisor_calls_total", {"operation": operation, "outcome": outcome}
    )


def test_rpcs_are_counted_by_method_and_status_code() -> None:
    metrics = Metrics()
    with served_on_fake(metrics) as served:
        stub = served.stub
        created = stub.Create(pb.CreateRequest(name="m-1", class_json=CLASS_JSON), timeout=5)
        stub.Describe(pb.DescribeRequest(id=created.id), timeout=5)
        stub.Describe(pb.DescribeRequest(id=created.id), timeout=5)
        refused = code_of(stub.Create, pb.CreateRequest(name="", class_json=CLASS_JSON))
        assert refused is grpc.StatusCode.INVALID_ARGUMENT
        missing = code_of(stub.Power, pb.PowerRequest(id="missing", op=pb.POWER_OP_ON))
        assert missing is grpc.StatusCode.NOT_FOUND

    assert requests(metrics, "Create", "OK") == 1
    assert requests(metrics, "Create", "INVALID_ARGUMENT") == 1
    assert requests(metrics, "Describe", "OK") == 2
    assert requests(metrics, "Power", "NOT_FOUND") == 1
    assert requests(metrics, "Describe", "NOT_FOUND") is None
    assert rpc_count(metrics, "Create") == 2  # one latency series per method, all codes
    assert rpc_count(metrics, "Describe") == 2
    slowest = metrics.registry.get_sample_value(
        "pyrigaud_rpc_duration_seconds_bucket", {"method": "Describe", "le": "600.0"}
    )
    assert slowest == 2


def test_a_bug_is_counted_as_internal_and_the_rpc_is_no_longer_in_flight() -> None:
    metrics = Metrics()
    seen_in_flight: list[float | None] = []

    def bug() -> None:
        seen_in_flight.append(metrics.registry.get_sample_value("pyrigaud_inflight_rpcs"))
        raise RuntimeError("a bug")

    with served_on_fake(metrics) as served:
        served.fake.faults.on_entry("describe", bug)
        code = code_of(served.stub.Describe, pb.DescribeRequest(id="x"))
    assert code is grpc.StatusCode.INTERNAL
    assert seen_in_flight == [1]
    assert metrics.registry.get_sample_value("pyrigaud_inflight_rpcs") == 0
    assert requests(metrics, "Describe", "INTERNAL") == 1


def test_mutations_holding_a_slot_are_in_flight_and_a_refused_one_is_counted() -> None:
    metrics = Metrics()
    limiter = MutationLimiter(max_concurrent=1, clock=SystemClock())
    with served_on_fake(metrics, limiter) as served:
        assert metrics.registry.get_sample_value("pyrigaud_inflight_mutations") == 0
        with limiter.slot(None) as acquired:
            assert acquired
            assert metrics.registry.get_sample_value("pyrigaud_inflight_mutations") == 1
            # A deadline shorter than the limiter's margin: no waiting.
            code = code_of(served.stub.Delete, pb.DeleteRequest(id="any"), timeout=0.5)
            assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert metrics.registry.get_sample_value("pyrigaud_inflight_mutations") == 0
    assert requests(metrics, "Delete", "RESOURCE_EXHAUSTED") == 1


def test_hypervisor_calls_are_counted_by_operation_and_outcome() -> None:
    metrics = Metrics()
    fake = FakeHypervisor(ManualClock())
    backend = instrument_backend(fake_backend(fake), metrics)
    assert backend.inventory.describe("missing") == Success(None)
    fake.faults.fail("describe", ProviderError.unavailable("host down"), times=1)
    assert isinstance(backend.inventory.describe("missing"), Failure)
    fake.faults.fail("check", ProviderError.unavailable("host down"), times=1)
    assert not backend.health.check().ok
    assert backend.health.check().ok
    assert backend.capabilities.capabilities() == fake.capabilities

    assert calls(metrics, "describe", "ok") == 1
    assert calls(metrics, "describe", "unavailable") == 1
    assert calls(metrics, "check", "unavailable") == 1
    assert calls(metrics, "check", "ok") == 1
    assert calls(metrics, "capabilities", "ok") == 1
    duration = metrics.registry.get_sample_value(
        "pyrigaud_hypervisor_call_duration_seconds_count", {"operation": "describe"}
    )
    assert duration == 2


def test_an_exception_from_the_backend_is_counted_then_raised() -> None:
    metrics = Metrics()
    fake = FakeHypervisor(ManualClock())
    backend = instrument_backend(fake_backend(fake), metrics)

    def bug() -> None:
        raise TypeError("a bug in the backend")

    fake.faults.on_entry("describe", bug)
    with pytest.raises(TypeError):
        backend.inventory.describe("any")
    assert calls(metrics, "describe", "exception") == 1


def test_what_a_disk_port_hands_back_is_timed_too() -> None:
    """A landing site's calls (and a disk stream's) are operations of their own, shown at 0
    from the start like every port operation."""
    metrics = Metrics()
    backend = instrument_backend(fake_backend(FakeHypervisor(ManualClock())), metrics)
    for operation in ("read_chunk", "make", "receive", "keep_record", "land", "discard"):
        assert calls(metrics, operation, "ok") == 0
    assert backend.disk_transfer is not None
    site = ok(backend.disk_transfer.landing_site("timed", ""))
    assert site.earlier_record() == Success(None)
    assert calls(metrics, "landing_site", "ok") == 1
    assert calls(metrics, "earlier_record", "ok") == 1


def test_each_metrics_has_its_own_registry_with_every_family() -> None:
    first, second = Metrics(), Metrics()  # would raise "Duplicated timeseries" if shared
    first.record_rpc("Describe", "OK", 0.001)
    assert requests(first, "Describe", "OK") == 1
    assert requests(second, "Describe", "OK") is None
    second.session_reconnects.labels("libvirt").inc()
    second.credential_reloads.labels("file").inc()
    text = second.exposition()[0].decode()
    for family in (
        "pyrigaud_rpc_requests_total",
        "pyrigaud_rpc_duration_seconds",
        "pyrigaud_hypervisor_calls_total",
        "pyrigaud_hypervisor_call_duration_seconds",
        "pyrigaud_inflight_rpcs",
        "pyrigaud_inflight_mutations",
        "pyrigaud_staging_deferred_aborts",
        'pyrigaud_session_reconnects_total{backend="libvirt"} 1.0',
        'pyrigaud_credential_reloads_total{source="file"} 1.0',
    ):
        assert family in text


def test_buckets_tell_a_fast_describe_from_a_slow_one_and_a_long_create() -> None:
    metrics = Metrics()
    metrics.record_rpc("Describe", "OK", 0.0003)
    metrics.record_rpc("Describe", "OK", 0.004)
    metrics.record_rpc("Create", "OK", 200.0)

    def bucket(method: str, le: float) -> float | None:
        return metrics.registry.get_sample_value(
            "pyrigaud_rpc_duration_seconds_bucket", {"method": method, "le": str(le)}
        )

    assert bucket("Describe", LATENCY_BUCKETS_SECONDS[0]) == 1
    assert bucket("Describe", 0.0025) == 1
    assert bucket("Describe", 0.005) == 2
    assert bucket("Create", 120.0) == 0
    assert bucket("Create", 300.0) == 1


def test_calls_recorded_on_many_threads_add_up_while_being_scraped() -> None:
    metrics = Metrics()
    threads, calls_each = 8, 2000
    start = threading.Barrier(threads + 1)

    def serve() -> None:
        start.wait()
        for index in range(calls_each):
            metrics.rpc_began()
            metrics.record_rpc("Describe", "OK", 0.0001 * (index % 3))

    workers = [threading.Thread(target=serve) for _ in range(threads)]
    for worker in workers:
        worker.start()
    start.wait()
    scrapes = 0
    while any(worker.is_alive() for worker in workers):
        # Ends are read before begins: a scrape never shows fewer than none in flight.
        in_flight = metrics.registry.get_sample_value("pyrigaud_inflight_rpcs")
        assert in_flight is not None
        assert in_flight >= 0
        scrapes += 1
    for worker in workers:
        worker.join()

    total = threads * calls_each
    assert scrapes > 0
    assert requests(metrics, "Describe", "OK") == total
    assert rpc_count(metrics, "Describe") == total
    assert metrics.registry.get_sample_value("pyrigaud_inflight_rpcs") == 0
    fastest = metrics.registry.get_sample_value(
        "pyrigaud_rpc_duration_seconds_bucket", {"method": "Describe", "le": "0.0005"}
    )
    assert fastest == total
    assert metrics.registry.get_sample_value(
        "pyrigaud_rpc_duration_seconds_sum", {"method": "Describe"}
    ) == pytest.approx(threads * 0.0001 * sum(index % 3 for index in range(calls_each)))


def test_what_ended_threads_recorded_is_kept_in_one_total() -> None:
    metrics = Metrics()

    def one_call() -> None:
        metrics.rpc_began()
        metrics.record_rpc("Create", "OK", 0.2)
        metrics.record_hypervisor_call("create", "ok", 0.1)

    for _ in range(50):  # a thread per call, each gone before the next starts
        thread = threading.Thread(target=one_call)
        thread.start()
        thread.join()
    one_call()  # this thread too, still running

    assert requests(metrics, "Create", "OK") == 51
    assert rpc_count(metrics, "Create") == 51
    assert calls(metrics, "create", "ok") == 51
    assert metrics.registry.get_sample_value("pyrigaud_inflight_rpcs") == 0
    # Only threads still running keep counts of their own (private: the bound is the point).
    assert len(metrics.rpcs._threads) == 1
    assert len(metrics.hypervisor_calls._threads) == 1


def test_the_series_panels_and_alerts_read_are_at_zero_before_anything_happens() -> None:
    metrics = Metrics()
    PrometheusTransfers(metrics, "libvirt", ("pvc", "s3", "nfs"))
    PrometheusHypervisorCounters(metrics, "libvirt")
    metrics.expect_hypervisor_calls(["check", "describe"])
    sample = metrics.registry.get_sample_value
    assert calls(metrics, "check", "ok") == 0
    assert sample("pyrigaud_hypervisor_call_duration_seconds_count", {"operation": "check"}) == 0
    for counter in ("hypervisor_round_trips", "inventory_resyncs", "session_reconnects"):
        assert sample(f"pyrigaud_{counter}_total", {"backend": "libvirt"}) == 0, counter
    for device in ("disk_controller", "nic"):
        labels = {"backend": "libvirt", "device": device}
        assert sample("pyrigaud_hardware_fallbacks_total", labels) == 0
    assert sample("pyrigaud_credential_reloads_total", {"source": "files"}) == 0
    for storage in ("pvc", "s3", "nfs"):
        for direction in ("export", "import"):
            labels = {"backend": "libvirt", "storage": storage, "direction": direction}
            assert sample("pyrigaud_transfer_bytes_total", labels) == 0
            assert sample("pyrigaud_transfers_in_flight", labels) == 0
            assert sample("pyrigaud_transfer_duration_seconds_count", labels) == 0
            assert sample("pyrigaud_transfer_throughput_bytes_per_second_count", labels) == 0
            assert sample("pyrigaud_transfer_failures_total", {**labels, "phase": "verify"}) == 0
        left = {"backend": "libvirt", "storage": storage, "what": "tpm"}
        assert sample("pyrigaud_transfer_left_behind_total", left) == 0


def test_a_call_expected_at_zero_counts_from_there() -> None:
    metrics = Metrics()
    metrics.expect_hypervisor_calls(["check"])
    metrics.record_hypervisor_call("check", "ok", 0.002)
    metrics.expect_hypervisor_calls(["check"])  # a second backend built: nothing is reset
    assert calls(metrics, "check", "ok") == 1
    assert (
        metrics.registry.get_sample_value(
            "pyrigaud_hypervisor_call_duration_seconds_bucket",
            {"operation": "check", "le": "0.0025"},
        )
        == 1
    )


def test_a_served_provider_shows_each_rpc_and_each_port_operation_before_any_request() -> None:
    metrics = Metrics()
    with served_on_fake(metrics):
        assert requests(metrics, "Describe", "OK") == 0
        assert rpc_count(metrics, "Describe") == 0
        assert requests(metrics, "Create", "RESOURCE_EXHAUSTED") == 0  # refused for load
        assert requests(metrics, "Describe", "RESOURCE_EXHAUSTED") is None  # never refused
        assert calls(metrics, "check", "ok") == 0
        assert calls(metrics, "describe", "ok") == 0
