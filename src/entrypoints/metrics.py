"""The provider's Prometheus metrics, in a registry of their own.

One `Metrics` per server (the container's singleton) owns a dedicated `CollectorRegistry`,
never the process-global default, so tests and several servers in one process do not
collide. Every RPC and every hypervisor call is recorded (`record_rpc`,
`record_hypervisor_call`) into a `CallTally`: each serving thread counts into its own
tally, with no lock, and a scrape adds them up. prometheus_client's labelled children took
eight lock round trips and ~10 µs per Describe, which under 32-way load cost ~10% of the
server's throughput.

The series an operator's panels and alerts read exist at 0 from the start (each Provider
RPC's OK count, each port operation's ok count, each transfer's labels, each backend
counter): a `rate()` or `increase()` sees the first count as a rise, and a panel shows zero
rather than no data.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from pyrigaud.application.ports.transfer_metrics import TransferPhase
from pyrigaud.domain.disk_images import LeftBehind

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

_BUCKET_NAMES = (*(str(bound) for bound in LATENCY_BUCKETS_SECONDS), "+Inf")
# A disk transfer: seconds to the manager's 30-minute deadline and past it.
TRANSFER_BUCKETS_SECONDS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0)
MiB = 1024**2
TRANSFER_BUCKETS_BYTES_PER_SECOND = tuple(
    float(mib * MiB) for mib in (1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048)
)
TRANSFER_LABELS = ("backend", "storage", "direction")
# The labels whose series exist from the start (with the storages a provider can stage to):
# both directions, the credential sources that reload, the devices a hardware fallback is
# counted for.
DIRECTIONS = ("export", "import")
RELOADING_CREDENTIAL_SOURCES = ("files", "kubernetes")
FALLBACK_DEVICES = ("disk_controller", "nic")


class _ThreadCounts:
    """What one thread has recorded, written by that thread alone (or, for the threads that
    have ended, their total, under the tally's lock)."""

    __slots__ = ("begun", "durations", "outcomes")

    def __init__(self) -> None:
        self.begun = 0  # calls begun; those ended are the outcomes' sum
        self.outcomes: dict[tuple[str, str], int] = {}
        # Per key: a count per bucket (the last one past every bound), then the sum.
        self.durations: dict[str, list[float]] = {}

    def absorb(self, other: _ThreadCounts) -> None:
        """Add `other`'s counts to these; its dicts and lists are read through copies, so it
        may go on changing meanwhile."""
        self.begun += other.begun
        for pair, count in list(other.outcomes.items()):
            self.outcomes[pair] = self.outcomes.get(pair, 0) + count
        for key, values in list(other.durations.items()):
            total = self.durations.setdefault(key, [0.0] * len(values))
            for index, value in enumerate(list(values)):
                total[index] += value


class CallTally(Collector):
    """Calls of one kind, counted by (key, outcome), timed by key, and those in flight:
    a counter, a histogram and a gauge on a scrape, as prometheus_client's would read.

    A dict or list copy is atomic under the GIL, so a scrape reads each thread's counts
    while that thread goes on writing them.
    """

    def __init__(
        self,
        counter: tuple[str, str, tuple[str, str]],
        histogram: tuple[str, str, str],
        in_flight: tuple[str, str] | None = None,
    ) -> None:
        self._counter, self._histogram, self._in_flight = counter, histogram, in_flight
        self._local = threading.local()
        self._threads: list[tuple[threading.Thread, _ThreadCounts]] = []
        self._ended_threads = _ThreadCounts()  # what threads that have ended recorded
        self._joining = threading.Lock()

    def _join(self) -> _ThreadCounts:
        """This thread's counts, made on its first call (the per-call paths read them from
        `_local` themselves: a frame fewer on every Describe)."""
        counts = self._local.counts = _ThreadCounts()
        with self._joining:
            self._fold_ended_threads()
            self._threads.append((threading.current_thread(), counts))
        return counts

    def _fold_ended_threads(self) -> None:
        """Counts of threads that have ended go into one total (under `_joining`): a thread
        per task or per request would otherwise grow the list for good."""
        running = []
        for thread, counts in self._threads:
            if thread.is_alive():
                running.append((thread, counts))
            else:
                self._ended_threads.absorb(counts)
        self._threads = running

    def expect(self, key: str, outcome: str) -> None:
        """Show (key, outcome) at 0, and key's histogram empty, until a call is recorded."""
        with self._joining:
            ended = self._ended_threads
            ended.outcomes.setdefault((key, outcome), 0)
            ended.durations.setdefault(key, [0.0] * (len(LATENCY_BUCKETS_SECONDS) + 2))

    def begin(self) -> None:
        """One call in flight until its `record`."""
        try:
            counts: _ThreadCounts = self._local.counts
        except AttributeError:
            counts = self._join()
        counts.begun += 1

    def record(self, key: str, outcome: str, seconds: float) -> None:
        """One call ended, counted by outcome and timed; where calls in flight are counted,
        after its `begin`."""
        try:
            counts: _ThreadCounts = self._local.counts
        except AttributeError:
            counts = self._join()
        pair = (key, outcome)
        counts.outcomes[pair] = counts.outcomes.get(pair, 0) + 1
        durations = counts.durations.get(key)
        if durations is None:
            durations = counts.durations[key] = [0.0] * (len(LATENCY_BUCKETS_SECONDS) + 2)
        durations[bisect_left(LATENCY_BUCKETS_SECONDS, seconds)] += 1
        durations[-1] += seconds

    def collect(self) -> Iterator[Metric]:
        with self._joining:
            self._fold_ended_threads()
            live = [counts for _, counts in self._threads]
            total = _ThreadCounts()
            total.absorb(self._ended_threads)
        # Ends are read before begins: a scrape never shows fewer than none in flight.
        ended = sum(total.outcomes.values()) + sum(sum(counts.outcomes.values()) for counts in live)
        begun = total.begun + sum(counts.begun for counts in live)
        for counts in live:
            total.absorb(counts)
        outcomes, durations = total.outcomes, total.durations
        name, help_text, labels = self._counter
        counter = CounterMetricFamily(name, help_text, labels=labels)
        for pair, count in sorted(outcomes.items()):
            counter.add_metric(pair, count)
        yield counter
        name, help_text, label = self._histogram
        histogram = HistogramMetricFamily(name, help_text, labels=(label,))
        for key, values in sorted(durations.items()):
            cumulative, buckets = 0.0, []
            for bound, in_bucket in zip(_BUCKET_NAMES, values[:-1], strict=True):
                cumulative += in_bucket
                buckets.append((bound, cumulative))
            histogram.add_metric((key,), buckets, sum_value=values[-1])
        yield histogram
        if self._in_flight is not None:
            yield GaugeMetricFamily(*self._in_flight, value=begun - ended)


class Metrics:
    """Every metric the provider exposes on the health port's /metrics."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.rpcs = CallTally(
            (
                "pyrigaud_rpc_requests",
                "Provider RPCs served, by method and gRPC status code.",
                ("method", "code"),
            ),
            ("pyrigaud_rpc_duration_seconds", "Time to serve a Provider RPC, by method.", "method"),
            (
                "pyrigaud_inflight_rpcs",
                "Provider RPCs being served right now, reads and mutations.",
            ),
        )
        self.registry.register(self.rpcs)
        self.hypervisor_calls = CallTally(
            (
                "pyrigaud_hypervisor_calls",
                "Calls into the hypervisor backend, by operation and outcome (ok or error kind).",
                ("operation", "outcome"),
            ),
            (
                "pyrigaud_hypervisor_call_duration_seconds",
                "Time spent in a hypervisor backend call, by operation.",
                "operation",
            ),
        )
        self.registry.register(self.hypervisor_calls)
        # The per-call recorders are the tallies' own methods: no frame of Metrics' own on an
        # RPC's path.
        self.rpc_began: Callable[[], None] = self.rpcs.begin
        # One RPC ended (after `rpc_began`): method, gRPC status code name, seconds.
        self.record_rpc: Callable[[str, str, float], None] = self.rpcs.record
        # One hypervisor call: operation, outcome ("ok" or the error kind), seconds.
        self.record_hypervisor_call: Callable[[str, str, float], None] = (
            self.hypervisor_calls.record
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
        for source in RELOADING_CREDENTIAL_SOURCES:
            self.credential_reloads.labels(source)
        self.inventory_resyncs = Counter(
            "pyrigaud_inventory_resyncs",
            "Inventory caches read afresh after their update feed broke, by backend.",
            ["backend"],
            registry=self.registry,
        )
        self.hypervisor_round_trips = Counter(
            "pyrigaud_hypervisor_round_trips",
            "Calls the ports made into the hypervisor's API (libvirt, vCenter), by backend: "
            "what a cached answer saves.",
            ["backend"],
            registry=self.registry,
        )
        self.hardware_fallbacks = Counter(
            "pyrigaud_hardware_fallbacks",
            "VMs made from an imported disk with a device their guest was not known to have "
            "drivers for (no equivalent on this hypervisor), by backend and device.",
            ["backend", "device"],
            registry=self.registry,
        )

        self.transfer_bytes = Counter(
            "pyrigaud_transfer_bytes",
            "Disk bytes moved between the hypervisor and the staging storage, as they pass.",
            TRANSFER_LABELS,
            registry=self.registry,
        )
        self.transfers_in_flight = Gauge(
            "pyrigaud_transfers_in_flight",
            "Disk exports and imports running right now.",
            TRANSFER_LABELS,
            registry=self.registry,
        )
        self.transfer_duration = Histogram(
            "pyrigaud_transfer_duration_seconds",
            "Time a disk export or import took, however it ended.",
            TRANSFER_LABELS,
            buckets=TRANSFER_BUCKETS_SECONDS,
            registry=self.registry,
        )
        self.transfer_throughput = Histogram(
            "pyrigaud_transfer_throughput_bytes_per_second",
            "Staged bytes per second of each disk export or import that succeeded.",
            TRANSFER_LABELS,
            buckets=TRANSFER_BUCKETS_BYTES_PER_SECOND,
            registry=self.registry,
        )
        self.transfer_left_behind = Counter(
            "pyrigaud_transfer_left_behind",
            "Disk exports whose VM had what the moved disk does not carry (other_disks, tpm, "
            "nvram, later_snapshots): a VM made from it elsewhere starts without it.",
            ("backend", "storage", "what"),
            registry=self.registry,
        )
        self.staging_deferred_aborts = Gauge(
            "pyrigaud_staging_deferred_aborts",
            "Failed transfers' S3 uploads and NFS temporaries whose abort waits for the store "
            "to answer again (docs/staging-resilience.md).",
            registry=self.registry,
        )
        self.transfer_failures = Counter(
            "pyrigaud_transfer_failures",
            "Disk exports and imports that failed, by the phase they failed in (open, read, "
            "write, verify, commit).",
            (*TRANSFER_LABELS, "phase"),
            registry=self.registry,
        )

    def expect_rpc(self, method: str, *, mutation: bool) -> None:
        """Show the RPC's OK count at 0 from the start, and a mutation's refusals for load
        (RESOURCE_EXHAUSTED, which a panel reads by name)."""
        self.rpcs.expect(method, "OK")
        if mutation:
            self.rpcs.expect(method, "RESOURCE_EXHAUSTED")

    def expect_hypervisor_calls(self, operations: Iterable[str]) -> None:
        """Show each port operation's ok count at 0 from the start."""
        for operation in operations:
            self.hypervisor_calls.expect(operation, "ok")

    def watch_deferred_aborts(self, count: Callable[[], int]) -> None:
        """Read the staging aborts waiting for their store at scrape time from their owner."""
        self.staging_deferred_aborts.set_function(count)

    def watch_inflight_mutations(self, count: Callable[[], int]) -> None:
        """Read the mutation count at scrape time from its owner (the limiter)."""
        self.inflight_mutations.set_function(count)

    def exposition(self, accept: str = "") -> tuple[bytes, str]:
        """The registry and its content type, in the format the scraper's Accept asks for:
        OpenMetrics for Prometheus, the classic 0.0.4 text format for anyone else."""
        encode, content_type = choose_encoder(accept)
        return encode(self.registry), content_type


class PrometheusTransfers:
    """The TransferMetrics port on these metrics, for the hypervisor `backend` serving; its
    series, for each of the `storages` it can stage to and each direction (and failure phase,
    and what an export leaves behind), are shown at 0 from the start."""

    def __init__(self, metrics: Metrics, backend: str, storages: Iterable[str]) -> None:
        self._metrics = metrics
        self._backend = backend
        for storage in storages:
            for direction in DIRECTIONS:
                labels = (backend, storage, direction)
                metrics.transfer_bytes.labels(*labels)
                metrics.transfers_in_flight.labels(*labels)
                metrics.transfer_duration.labels(*labels)
                metrics.transfer_throughput.labels(*labels)
                for phase in TransferPhase:
                    metrics.transfer_failures.labels(*labels, phase.value)
            for what in LeftBehind:
                metrics.transfer_left_behind.labels(backend, storage, what.value)

    def started(self, direction: str, storage: str) -> None:
        self._metrics.transfers_in_flight.labels(self._backend, storage, direction).inc()

    def moved(self, direction: str, storage: str, count: int) -> None:
        self._metrics.transfer_bytes.labels(self._backend, storage, direction).inc(count)

    def left_behind(self, storage: str, what: LeftBehind) -> None:
        self._metrics.transfer_left_behind.labels(self._backend, storage, what.value).inc()

    def ended(
        self,
        direction: str,
        storage: str,
        *,
        seconds: float,
        size_bytes: int,
        failed_in: TransferPhase | None,
    ) -> None:
        labels = (self._backend, storage, direction)
        self._metrics.transfers_in_flight.labels(*labels).dec()
        self._metrics.transfer_duration.labels(*labels).observe(seconds)
        if failed_in is not None:
            self._metrics.transfer_failures.labels(*labels, failed_in.value).inc()
        elif size_bytes and seconds > 0:
            self._metrics.transfer_throughput.labels(*labels).observe(size_bytes / seconds)


class PrometheusHypervisorCounters:
    """The HypervisorCounters a builder takes, labelled with the hypervisor `backend`: every
    series is shown (at 0) from the start, whether or not this hypervisor counts it."""

    def __init__(self, metrics: Metrics, backend: str) -> None:
        self._metrics = metrics
        self._backend = backend
        metrics.session_reconnects.labels(backend)
        metrics.inventory_resyncs.labels(backend)
        metrics.hypervisor_round_trips.labels(backend)
        for device in FALLBACK_DEVICES:
            metrics.hardware_fallbacks.labels(backend, device)

    @property
    def on_reconnect(self) -> Callable[[], None]:
        return self._metrics.session_reconnects.labels(self._backend).inc

    @property
    def on_resync(self) -> Callable[[], None]:
        return self._metrics.inventory_resyncs.labels(self._backend).inc

    @property
    def on_round_trip(self) -> Callable[[], None]:
        return self._metrics.hypervisor_round_trips.labels(self._backend).inc

    def on_hardware_fallback(self, device: str) -> Callable[[], None]:
        return self._metrics.hardware_fallbacks.labels(self._backend, device).inc
