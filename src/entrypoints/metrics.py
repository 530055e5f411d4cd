"""The provider's Prometheus metrics, in a registry of their own.

One `Metrics` per server (the container's singleton) owns a dedicated `CollectorRegistry`,
never the process-global default, so tests and several servers in one process do not
collide. The hot path (`record_rpc`, `record_hypervisor_call`) caches the labelled children:
`.labels()` validates and locks on every call, a dict lookup does not.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

# From a sub-millisecond Describe on the fake to a minutes-long Create or disk import.
LATENCY_BUCKETS_SECONDS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)


class Metrics:
    """Every metric the provider exposes on the health port's /metrics."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.rpc_requests = Counter(
            "pyrigaud_rpc_requests",
            "Provider RPCs served, by method and gRPC status code.",
            ["method", "code"],
            registry=self.registry,
        )
        self.rpc_duration = Histogram(
            "pyrigaud_rpc_duration_seconds",
            "Time to serve a Provider RPC, by method.",
            ["method"],
            buckets=LATENCY_BUCKETS_SECONDS,
            registry=self.registry,
        )
        self.hypervisor_calls = Counter(
            "pyrigaud_hypervisor_calls",
            "Calls into the hypervisor backend, by operation and outcome (ok or error kind).",
            ["operation", "outcome"],
            registry=self.registry,
        )
        self.hypervisor_call_duration = Histogram(
            "pyrigaud_hypervisor_call_duration_seconds",
            "Time spent in a hypervisor backend call, by operation.",
            ["operation"],
            buckets=LATENCY_BUCKETS_SECONDS,
            registry=self.registry,
        )
        self.inflight_rpcs = Gauge(
            "pyrigaud_inflight_rpcs",
            "Provider RPCs being served right now, reads and mutations.",
            registry=self.registry,
        )
        self.inflight_mutations = Gauge(
            "pyrigaud_inflight_mutations",
            "Mutations holding one of the provider's concurrency slots right now.",
            registry=self.registry,
        )
        self.session_reconnects = Counter(
            "pyrigaud_session_reconnects",
            "Hypervisor sessions re-established after a drop, by backend.",
            ["backend"],
            registry=self.registry,
        )
        self.credential_reloads = Counter(
            "pyrigaud_credential_reloads",
            "Credentials re-read after a change, by source.",
            ["source"],
            registry=self.registry,
        )
        self.inventory_resyncs = Counter(
            "pyrigaud_inventory_resyncs",
            "Inventory caches read afresh after their update feed broke, by backend.",
            ["backend"],
            registry=self.registry,
        )
        self.hypervisor_round_trips = Counter(
            "pyrigaud_hypervisor_round_trips",
            "Calls the ports made into the hypervisor's API (vCenter), by backend: what a "
            "cached answer saves.",
            ["backend"],
            registry=self.registry,
        )
        self._rpc_children: dict[tuple[str, grpc.StatusCode], tuple[Counter, Histogram]] = {}
        self._call_children: dict[tuple[str, str], tuple[Counter, Histogram]] = {}

    def record_rpc(self, method: str, code: grpc.StatusCode, seconds: float) -> None:
        children = self._rpc_children.get((method, code))
        if children is None:
            children = (
                self.rpc_requests.labels(method, code.name),
                self.rpc_duration.labels(method),
            )
            self._rpc_children[(method, code)] = children
        children[0].inc()
        children[1].observe(seconds)

    def record_hypervisor_call(self, operation: str, outcome: str, seconds: float) -> None:
        children = self._call_children.get((operation, outcome))
        if children is None:
            children = (
                self.hypervisor_calls.labels(operation, outcome),
                self.hypervisor_call_duration.labels(operation),
            )
            self._call_children[(operation, outcome)] = children
        children[0].inc()
        children[1].observe(seconds)

    def watch_inflight_mutations(self, count: Callable[[], int]) -> None:
        """Read the mutation count at scrape time from its owner (the limiter)."""
        self.inflight_mutations.set_function(count)

    def exposition(self, accept: str = "") -> tuple[bytes, str]:
        """The registry and its content type, in the format the scraper's Accept asks for:
        OpenMetrics for Prometheus, the classic 0.0.4 text format for anyone else."""
        encode, content_type = choose_encoder(accept)
        return encode(self.registry), content_type
