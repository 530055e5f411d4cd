"""vSphere backend on govmomi's simulator: pyrigaud against the naive per-VM way and the floor.

Usage (from the repository root, with the project's venv; the simulator launcher is built by
scripts/vcsim.sh on first use, from Debian's golang-go and golang-github-vmware-govmomi-dev):

    .venv/bin/python bench/vsphere_bench.py                      # 10,000 VMs, ~5 min
    .venv/bin/python bench/vsphere_bench.py --sizes 1000 --json out.json
    .venv/bin/python bench/vsphere_bench.py --profile            # + cProfile of list_vms()

For each size the script starts the simulator (tools/vcsim) on a free loopback port with the
default VPX inventory and `-vm size/2` VMs per resource pool (the inventory has two pools: the
standalone host DC0_H0 and the cluster DC0_C0, every VM powered on), starts `pyrigaud serve`
on it (PROVIDER_TYPE=vsphere, plaintext gRPC, 127.0.0.1 only) and measures, side by side in the
same run and with the same properties pyrigaud reads:

    ListVMs   floor     one raw RetrievePropertiesEx (+ ContinueRetrievePropertiesEx while a
                        token comes back) through a container view: the least any client does
              naive     the container view's VM list, then pyvmomi attribute access per VM
                        (vm.name, vm.runtime..., vm.config..., vm.guest...: one property fetch,
                        one round trip, per attribute read); timed on the first --naive-sample
                        VMs and extrapolated linearly (said so in the note)
              adapter   VSphereInventory.list_vms() in this process, its inventory cache warm
              gRPC      ListVMs through `pyrigaud serve`, its inventory cache warm
    Describe  floor     one raw RetrievePropertiesEx of the VM's properties
              naive     pyvmomi attribute access of the same properties, one fetch each
              adapter   VSphereInventory.describe(), cache warm
              gRPC      Describe through `pyrigaud serve`, cache warm
              fake gRPC Describe through a second `pyrigaud serve` on the fake backend (100
                        VMs), call for call in turn with the one above

The listings are interleaved round by round, so drift and other load hit every way alike.
Also reported: the time from the server being ready until a Describe is answered from its
cache (time to warm), vCenter calls per Describe after warm-up (the server's
pyrigaud_hypervisor_round_trips, read from its /metrics, and this process's adapter, counted
by its session), the server's RSS at the end (VmRSS, and VmHWM for the peak), and how soon a
rename made by another vCenter client shows in Describe.
First, before all that, a cold start: a server of its own gets ListVMs as soon as it is ready
(the manager lists right after a provider restart), while its inventory cache is still reading
the whole view; reported are that ListVMs's time and the server's peak RSS (VmHWM) once it
answered and once the cache is warm, and its answer must hold every VM the warm one lists.
"py CPU" is the CPU of the Python process doing the vSphere work per call (this process for
floor, naive and adapter; the pyrigaud server for gRPC): the rest of the wall time is the
simulator's (on the same cores) and the wire.

Targets (reported, not asserted): warm ListVMs at least 10x faster than the floor, Describe p50
within 1.5x of the fake backend's, no vCenter call per Describe, server RSS under 250 MiB,
its peak through the cold start under 200 MiB; and the encoded ListVMs answer under the
manager's 4 MiB default gRPC message limit: the exit status is 1 when an answer (or, below
10,000 VMs, its linear extrapolation to 10,000) is over.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import gc
import io
import json
import os
import pstats
import random
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc
from describe_bench import (
    HOST,
    Processes,
    Target,
    machine,
    percentile,
    seed_vms,
    wait_ready,
)
from describe_bench import start_pyrigaud as start_fake
from pyVim import connect as untyped_connect
from pyVmomi import vim as untyped_vim
from pyVmomi import vmodl as untyped_vmodl

from pyrigaud.adapters.clocks import SystemClock
from pyrigaud.adapters.hypervisors.vsphere.properties import VM_PROPERTIES
from pyrigaud.adapters.hypervisors.vsphere.session import VSphereSession
from pyrigaud.application.ports import Inventory
from pyrigaud.entrypoints.grpc import translate
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2_grpc as pb_grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the launcher's home
from support.ports import free_port
from support.vsphere import Simulator, backend_over, running_simulator

connect: Any = untyped_connect  # pyVim and pyVmomi's constructors are untyped
vim: Any = untyped_vim
vmodl: Any = untyped_vmodl

RPC_TIMEOUT = 300.0
MAX_MESSAGE = 256 * 1024 * 1024  # so an answer over 4 MiB is still received and measured
MANAGER_MESSAGE_LIMIT = 4 * 1024 * 1024  # grpc-go's default receive limit, kept by the manager
TARGET_VMS = 10_000
TARGET_SPEEDUP = 10.0  # warm ListVMs against the floor
TARGET_FAKE_FACTOR = 1.5  # Describe p50 against the fake backend's
TARGET_RSS_MIB = 250.0
TARGET_COLD_PEAK_MIB = 200.0  # the server's peak through a cold-start ListVMs
FAKE_VMS = 100
OUTSIDE_CHANGES = 5
ROUND_TRIPS = 'pyrigaud_hypervisor_round_trips_total{backend="vsphere"}'
DESCRIBE_PROPERTIES = ("name", "runtime.powerState", "guest.net", "config.hardware")  # describe()


@dataclass
class Row:
    size: int
    operation: str
    way: str
    calls: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    py_cpu_ms: float  # per call, of the Python process doing the vSphere work
    vs_floor: float  # p50 over the floor's p50
    note: str = ""


@dataclass
class Timings:
    """One way's sorted wall latencies and the CPU it spent per call."""

    latencies: list[float]
    cpu_per_call: float


Clock = Callable[[], float]


def timed(action: Callable[[], object], calls: int, cpu: Clock = time.process_time) -> Timings:
    latencies: list[float] = []
    spent = cpu()
    for _ in range(calls):
        started = time.perf_counter()
        action()
        latencies.append(time.perf_counter() - started)
    return Timings(sorted(latencies), (cpu() - spent) / max(calls, 1))


def merged(samples: Sequence[Timings]) -> Timings:
    latencies = sorted(value for sample in samples for value in sample.latencies)
    cpu = statistics.fmean(sample.cpu_per_call for sample in samples)
    return Timings(latencies, cpu)


def milliseconds(seconds: float) -> float:
    return round(seconds * 1000, 3)


# --- the ways -------------------------------------------------------------------------------


def connect_raw(simulator: Simulator) -> Any:
    """A pyVmomi service instance of our own: the floor and the naive way share nothing with
    pyrigaud's session."""
    url = urlsplit(simulator.endpoint)
    return connect.SmartConnect(
        host=url.hostname,
        port=url.port,
        path=url.path,
        user=simulator.username,
        pwd=simulator.password,
        disableSslCertValidation=True,
    )


def vm_view(content: Any) -> Any:
    return content.viewManager.CreateContainerView(content.rootFolder, [vim.VirtualMachine], True)


def all_vms(content: Any) -> list[Any]:
    """The naive way's first step: every VM's MoRef, read from a container view."""
    view = vm_view(content)
    try:
        return list(view.view)
    finally:
        view.DestroyView()


def raw_paged_listing(content: Any, page_size: int) -> int:
    """The floor: VM_PROPERTIES of every VM, pages of `page_size`, objects left as pyVmomi gave
    them. Returns the number of VMs."""
    query = vmodl.query.PropertyCollector
    view = vm_view(content)
    try:
        traversal = query.TraversalSpec(
            name="view", path="view", skip=False, type=vim.view.ContainerView
        )
        spec = query.FilterSpec(
            objectSet=[query.ObjectSpec(obj=view, skip=True, selectSet=[traversal])],
            propSet=[query.PropertySpec(type=vim.VirtualMachine, pathSet=list(VM_PROPERTIES))],
        )
        collector = content.propertyCollector
        page = collector.RetrievePropertiesEx([spec], query.RetrieveOptions(maxObjects=page_size))
        count = 0
        while page is not None:
            count += len(page.objects)
            if not page.token:
                break
            page = collector.ContinueRetrievePropertiesEx(page.token)
        return count
    finally:
        view.DestroyView()


def raw_describe(content: Any, vm: Any) -> None:
    query = vmodl.query.PropertyCollector
    spec = query.FilterSpec(
        objectSet=[query.ObjectSpec(obj=vm)],
        propSet=[query.PropertySpec(type=vim.VirtualMachine, pathSet=list(DESCRIBE_PROPERTIES))],
    )
    if not content.propertyCollector.RetrievePropertiesEx([spec], query.RetrieveOptions()).objects:
        raise RuntimeError(f"{vm} has vanished")


def naive_list_one(vm: Any) -> None:
    """VM_PROPERTIES the way a straightforward pyvmomi client reads them: attribute by attribute,
    each a property fetch of its own."""
    _ = (vm.name, vm.runtime.powerState, vm.config.hardware.numCPU, vm.config.hardware.memoryMB)
    _ = (vm.config.hardware.device, vm.guest.net)


def naive_describe(vm: Any) -> None:
    _ = (vm.name, vm.runtime.powerState, vm.guest.net, vm.config.hardware)


# --- one size -------------------------------------------------------------------------------


@dataclass
class Server:
    target: Target
    metrics_url: str
    process: subprocess.Popen[bytes]

    def round_trips(self) -> float:
        """The server's vCenter calls so far, from its /metrics."""
        with urllib.request.urlopen(self.metrics_url, timeout=10) as answer:
            text = answer.read().decode()
        counts = [
            line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith(ROUND_TRIPS)
        ]
        if not counts:
            raise RuntimeError(f"the server's /metrics has no {ROUND_TRIPS}")
        return float(counts[0])

    def rss_mib(self) -> tuple[float, float]:
        """The server's resident memory now and at its peak (VmRSS, VmHWM), MiB."""
        status = Path(f"/proc/{self.target.pid}/status").read_text().splitlines()
        kib = {line.split(":")[0]: int(line.split()[1]) for line in status if line.startswith("Vm")}
        return kib["VmRSS"] / 1024, kib["VmHWM"] / 1024


def start_pyrigaud(processes: Processes, simulator: Simulator) -> Server:
    port, health_port = free_port(), free_port()
    env = dict(os.environ, PROVIDER_TYPE="vsphere", PROVIDER_ENDPOINT=simulator.endpoint)
    env.update(VIRTRIGAUD_PROVIDER_INSECURE="true", TLS_INSECURE_SKIP_VERIFY="true")
    env.update(LOG_LEVEL="warn", PYRIGAUD_CREDENTIALS="env")
    env.update(
        PYRIGAUD_CREDENTIAL_USERNAME=simulator.username,
        PYRIGAUD_CREDENTIAL_PASSWORD=simulator.password,
    )
    argv = [str(Path(sys.executable).with_name("pyrigaud")), "serve", "--port", str(port)]
    argv += ["--health-port", str(health_port), "--listen-address", HOST]
    process = processes.start(argv, env)
    options = [("grpc.max_receive_message_length", MAX_MESSAGE)]
    channel = grpc.insecure_channel(f"{HOST}:{port}", options=options)
    wait_ready(processes, process, channel)
    metrics_url = f"http://{HOST}:{health_port}/metrics"
    return Server(Target("pyrigaud", channel, process.pid), metrics_url, process)


def wait_warm(describe: Callable[[], object], round_trips: Callable[[], float]) -> float:
    """Seconds until a Describe makes no vCenter call (the inventory cache answered it)."""
    started = time.perf_counter()
    while time.perf_counter() - started < RPC_TIMEOUT:
        before = round_trips()
        describe()
        if round_trips() == before:
            return time.perf_counter() - started
        time.sleep(0.05)
    raise RuntimeError("the inventory cache did not warm")


def outside_change_seen(vm: Any, describe: Callable[[], str]) -> float:
    """Seconds from another client's rename of `vm` (its task done: the simulator's tasks end
    within the call) until pyrigaud's Describe shows it."""
    name = f"renamed-{time.monotonic_ns()}"
    vm.Rename_Task(name)
    started = time.perf_counter()
    while describe() != name:
        if time.perf_counter() - started > 60:
            raise RuntimeError("an outside rename never showed")
        time.sleep(0.005)
    return time.perf_counter() - started


@dataclass
class ColdStart:
    """A server's first minutes: ListVMs sent as soon as it is ready, while its inventory
    cache is still reading the whole view."""

    list_seconds: float  # the ListVMs's wall time
    listed_ids: list[str]  # what it answered
    warm_seconds: float  # ready until a Describe is answered from the cache
    rss_after_list: tuple[float, float]  # the server's VmRSS and VmHWM once ListVMs answered
    rss_after_warm: tuple[float, float]  # and once the cache is warm


def cold_start(processes: Processes, simulator: Simulator, first: str) -> ColdStart:
    """The manager lists right after a provider restart: a fresh server, ListVMs at once."""
    server = start_pyrigaud(processes, simulator)
    stub = pb_grpc.ProviderStub(server.target.channel)
    started = time.perf_counter()
    answer = stub.ListVMs(pb.ListVMsRequest(), timeout=RPC_TIMEOUT)
    list_seconds = time.perf_counter() - started
    after_list = server.rss_mib()
    warm = wait_warm(
        lambda: stub.Describe(pb.DescribeRequest(id=first), timeout=RPC_TIMEOUT),
        server.round_trips,
    )
    cold = ColdStart(
        list_seconds,
        [vm.id for vm in answer.vms],
        list_seconds + warm,
        after_list,
        server.rss_mib(),
    )
    server.target.channel.close()
    processes.stop(server.process)
    return cold


@dataclass
class SizeReport:
    rows: list[Row]
    answer_bytes: int
    warm_seconds: float = 0.0  # server start (ready) to a Describe answered from the cache
    round_trips_per_describe: float = 0.0  # the server's, after warm-up
    adapter_calls_per_describe: float = 0.0  # this process's adapter, counted by its session
    rss_mib: tuple[float, float] = (0.0, 0.0)  # the server's, now and peak
    rss_warm_mib: tuple[float, float] = (0.0, 0.0)  # the same server's once warm, before a list
    cold: ColdStart | None = None
    outside_seconds: list[float] = field(default_factory=list)
    profile: str = ""


def row(
    size: int, operation: str, way: str, timings: Timings, floor: Timings, note: str = ""
) -> Row:
    p50 = percentile(timings.latencies, 0.5)
    return Row(
        size,
        operation,
        way,
        len(timings.latencies),
        milliseconds(p50),
        milliseconds(percentile(timings.latencies, 0.95)),
        milliseconds(percentile(timings.latencies, 0.99)),
        milliseconds(timings.cpu_per_call),
        round(p50 / percentile(floor.latencies, 0.5), 2),
        note,
    )


def bench_size(args: Any, processes: Processes, size: int, profile: bool) -> SizeReport:
    started = time.perf_counter()
    with running_simulator("-vm", str(size // 2)) as simulator:
        built = time.perf_counter() - started
        content = connect_raw(simulator).content
        refs: list[Any] = []
        view_read = timed(lambda: refs.extend(all_vms(content)), 1)
        first = refs[0]._moId  # Describe takes a MoRef as well as an instanceUuid
        cold = cold_start(processes, simulator, first)
        server = start_pyrigaud(processes, simulator)
        stub = pb_grpc.ProviderStub(server.target.channel)
        warm = wait_warm(
            lambda: stub.Describe(pb.DescribeRequest(id=first), timeout=RPC_TIMEOUT),
            server.round_trips,
        )
        rss_warm = server.rss_mib()
        adapter_calls: list[int] = []
        session = VSphereSession(
            simulator.endpoint,
            lambda: (simulator.username, simulator.password),
            insecure=True,
            on_call=lambda: adapter_calls.append(1),
            clock=SystemClock(),
        )
        adapter = backend_over(session).inventory
        wait_warm(lambda: adapter.describe(first).unwrap(), lambda: float(len(adapter_calls)))
        fake = start_fake(processes, "fake")
        fake_stub = pb_grpc.ProviderStub(fake.channel)
        fake_ids = seed_vms(fake.channel, FAKE_VMS)
        answers: list[pb.ListVMsResponse] = []

        def grpc_listing() -> None:
            answers.append(stub.ListVMs(pb.ListVMsRequest(), timeout=RPC_TIMEOUT))

        timed(grpc_listing, 1)
        if len(answers[0].vms) != size or raw_paged_listing(content, args.page_size) != size:
            raise RuntimeError(f"expected {size} VMs, pyrigaud listed {len(answers[0].vms)}")
        if sorted(cold.listed_ids) != sorted(vm.id for vm in answers[0].vms):
            raise RuntimeError(
                f"the cold-start ListVMs answered {len(cold.listed_ids)} VMs, not the {size} "
                "the warm one lists"
            )
        adapter.list_vms().unwrap()

        ways: dict[str, list[Timings]] = {"floor": [], "adapter": [], "gRPC": []}
        listing_ways: dict[str, Callable[[], Timings]] = {
            "floor": lambda: timed(lambda: raw_paged_listing(content, args.page_size), 1),
            "adapter": lambda: timed(lambda: adapter.list_vms().unwrap(), 1),
            "gRPC": lambda: timed(grpc_listing, 1, server.target.cpu_seconds),
        }
        for repeat in range(args.list_repeats):  # the floor first, then last, in turn
            order = list(listing_ways) if repeat % 2 == 0 else list(reversed(listing_ways))
            for way in order:
                ways[way].append(listing_ways[way]())
        listings = {way: merged(samples) for way, samples in ways.items()}

        sample = refs[: args.naive_sample]
        per_vm = iter(sample)
        naive_vms = timed(lambda: naive_list_one(next(per_vm)), len(sample))
        naive_listing = Timings(
            [view_read.latencies[0] + statistics.fmean(naive_vms.latencies) * size],
            view_read.cpu_per_call + naive_vms.cpu_per_call * size,
        )

        # pyrigaud's ids are instanceUuids; the raw ways take MoRefs of equally random VMs.
        rng = random.Random(size)
        ids = [vm.id for vm in answers[0].vms]
        calls = args.describe_calls
        chosen = [rng.choice(ids) for _ in range(calls)]
        refs_chosen = [rng.choice(refs) for _ in range(calls)]
        naive_share = refs_chosen[: args.naive_describe_calls]
        floor_refs, naive_refs = iter(refs_chosen), iter(naive_share)
        adapter_ids = iter(chosen)
        for vm_id in chosen[:20]:  # warm-up of the gRPC path
            stub.Describe(pb.DescribeRequest(id=vm_id), timeout=60)
            fake_stub.Describe(pb.DescribeRequest(id=rng.choice(fake_ids)), timeout=60)
        adapter_before = len(adapter_calls)
        # Floor, adapter, adapter, floor (half the calls each time): neither always first.
        first_half, second_half = (calls + 1) // 2, calls // 2
        floor_describes = [timed(lambda: raw_describe(content, next(floor_refs)), first_half)]
        adapter_describes = [
            timed(lambda: adapter.describe(next(adapter_ids)).unwrap(), first_half),
            timed(lambda: adapter.describe(next(adapter_ids)).unwrap(), second_half),
        ]
        floor_describes.append(timed(lambda: raw_describe(content, next(floor_refs)), second_half))
        describes = {
            "floor": merged(floor_describes),
            "naive": timed(lambda: naive_describe(next(naive_refs)), len(naive_share)),
            "adapter": merged(adapter_describes),
        }
        adapter_per_describe = (len(adapter_calls) - adapter_before) / calls
        # The vSphere server and the fake one, call by call in turn: the same load hits both.
        round_trips_before = server.round_trips()
        vsphere_times: list[float] = []
        fake_times: list[float] = []
        for index, vm_id in enumerate(chosen):  # which goes first alternates call by call
            vsphere_call = functools.partial(
                stub.Describe, pb.DescribeRequest(id=vm_id), timeout=60
            )
            fake_id = rng.choice(fake_ids)
            fake_call = functools.partial(
                fake_stub.Describe, pb.DescribeRequest(id=fake_id), timeout=60
            )
            if index % 2:
                fake_times += timed(fake_call, 1).latencies
            vsphere_times += timed(vsphere_call, 1).latencies
            if not index % 2:
                fake_times += timed(fake_call, 1).latencies
        per_describe = (server.round_trips() - round_trips_before) / calls
        describes["gRPC"] = Timings(sorted(vsphere_times), float("nan"))
        describes["fake gRPC"] = Timings(sorted(fake_times), float("nan"))

        def described_name(vm_id: str) -> str:
            answer = stub.Describe(pb.DescribeRequest(id=vm_id), timeout=60)
            return str(json.loads(answer.provider_raw_json or "{}").get("name", ""))

        outside = [
            outside_change_seen(ref, functools.partial(described_name, ref._moId))
            for ref in rng.sample(refs, OUTSIDE_CHANGES)
        ]
        report = SizeReport(
            [],
            answers[0].ByteSize(),
            warm_seconds=warm,
            round_trips_per_describe=per_describe,
            adapter_calls_per_describe=adapter_per_describe,
            rss_mib=server.rss_mib(),
            rss_warm_mib=rss_warm,
            cold=cold,
            outside_seconds=outside,
        )
        if profile:
            report.profile = profile_listing(adapter, size, args.profile_top)
        session.close()
    processes.stop_all()

    megabytes = report.answer_bytes / 1e6
    list_floor = listings["floor"]
    report.rows = [
        row(size, "ListVMs", "floor", list_floor, list_floor, f"simulator built in {built:.1f} s"),
        row(
            size,
            "ListVMs",
            "naive (extrapolated)",
            naive_listing,
            list_floor,
            f"extrapolated from {len(sample)} VMs ({milliseconds(naive_vms.latencies[0]):.1f}-"
            f"{milliseconds(naive_vms.latencies[-1]):.1f} ms each)",
        ),
        row(size, "ListVMs", "adapter", listings["adapter"], list_floor, "warm"),
        row(
            size,
            "ListVMs",
            "gRPC",
            listings["gRPC"],
            list_floor,
            f"warm; answer {report.answer_bytes:,} B ({megabytes:.2f} MB)",
        ),
    ]
    report.rows += [
        row(size, "Describe", way, timings, describes["floor"])
        for way, timings in describes.items()
    ]
    return report


def profile_listing(adapter: Inventory, size: int, top: int) -> str:
    """Where list_vms() spends its time, in this process: its wall time and the cyclic GC's
    share of it, what the servicer adds, then a cProfile (the simulator's share shows up as
    reading the socket)."""
    collecting = [0.0, 0.0]  # when the running collection started, seconds collected so far

    def track(phase: str, _info: dict[str, int]) -> None:
        if phase == "start":
            collecting[0] = time.perf_counter()
        else:
            collecting[1] += time.perf_counter() - collecting[0]

    listed: list[Any] = []
    gc.callbacks.append(track)
    try:
        whole = timed(lambda: listed.extend(adapter.list_vms().unwrap()), 1).latencies[0]
    finally:
        gc.callbacks.remove(track)
    encoded = timed(
        lambda: pb.ListVMsResponse(
            vms=[translate.vm_info(vm) for vm in listed]
        ).SerializeToString(),
        1,
    ).latencies[0]
    profiler = cProfile.Profile()
    profiler.enable()
    adapter.list_vms().unwrap()
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    cumulative = {
        name: entry[3]
        for (path, _, name), entry in stats.stats.items()  # type: ignore[attr-defined]
        if "hypervisors/vsphere" in path
    }
    total, read = cumulative.get("list_vms", 0.0), cumulative.get("retrieve_all_vms", 0.0)
    lines = [
        f"In-process list_vms() on {size:,} VMs: {whole:.2f} s unprofiled, of which Python's "
        f"cyclic GC {collecting[1]:.2f} s",
        f"- its answer to protobuf (translate + serialize, the servicer's part): {encoded:.2f} s",
        f"- profiled: {total:.2f} s, of which the property read (retrieve_all_vms: pyVmomi's "
        f"request and SOAP parsing) {read:.2f} s, pyrigaud's rows to VMInfo {total - read:.2f} s",
    ]
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(r"hypervisors/vsphere", top)
    return (
        "\n".join(lines)
        + "\n\ncProfile of list_vms(), by own time, then pyrigaud's own:\n"
        + (out.getvalue())
    )


# --- report ---------------------------------------------------------------------------------


def table(rows: list[Row]) -> str:
    lines = [
        "| VMs | operation | way | calls | p50 ms | p95 ms | p99 ms | py CPU ms/call "
        "| vs floor | note |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.size:,} | {r.operation} | {r.way} | {r.calls} | {r.p50_ms:,.3f} "
            f"| {r.p95_ms:,.3f} | {r.p99_ms:,.3f} | {r.py_cpu_ms:,.3f} | {r.vs_floor:.2f}x "
            f"| {r.note} |"
        )
    return "\n".join(lines)


def verdicts(reports: dict[int, SizeReport]) -> tuple[list[str], bool]:
    """The lines to print, and whether every answer fits the manager's limit."""
    lines: list[str] = []
    fits = True
    for size, report in reports.items():
        by_way = {(r.operation, r.way): r for r in report.rows}
        floor = by_way[("ListVMs", "floor")].p50_ms
        for way in ("adapter", "gRPC"):
            speedup = floor / by_way[("ListVMs", way)].p50_ms
            verdict = "met" if speedup >= TARGET_SPEEDUP else "MISSED"
            lines.append(
                f"ListVMs {way} (warm) at {size:,} VMs: {speedup:.1f}x faster than the floor "
                f"(target {TARGET_SPEEDUP:g}x: {verdict})"
            )
        ratio = by_way[("Describe", "gRPC")].p50_ms / by_way[("Describe", "fake gRPC")].p50_ms
        verdict = "met" if ratio <= TARGET_FAKE_FACTOR else "MISSED"
        lines.append(
            f"Describe p50 at {size:,} VMs: {by_way[('Describe', 'gRPC')].p50_ms:.3f} ms, "
            f"{ratio:.2f}x the fake backend's {by_way[('Describe', 'fake gRPC')].p50_ms:.3f} ms "
            f"in the same run (target {TARGET_FAKE_FACTOR:g}x: {verdict})"
        )
        lines.append(
            f"vCenter calls per Describe after warm-up: server "
            f"{report.round_trips_per_describe:g} (pyrigaud_hypervisor_round_trips), "
            f"in-process adapter {report.adapter_calls_per_describe:g}"
        )
        lines.append(
            f"Time to warm (server ready to a cached Describe): {report.warm_seconds:.1f} s"
        )
        now, peak = report.rss_mib
        verdict = "met" if now < TARGET_RSS_MIB else "MISSED"
        lines.append(
            f"Server RSS after the run: {now:.0f} MiB (peak {peak:.0f} MiB; target "
            f"< {TARGET_RSS_MIB:g} MiB: {verdict})"
        )
        lines.append(
            f"Server RSS once warm, before any ListVMs: {report.rss_warm_mib[0]:.0f} MiB "
            f"(peak {report.rss_warm_mib[1]:.0f} MiB)"
        )
        if report.cold is not None:
            cold = report.cold
            peak = cold.rss_after_warm[1]
            verdict = "met" if peak < TARGET_COLD_PEAK_MIB else "MISSED"
            lines.append(
                f"Cold start (ListVMs as soon as the server is ready): answered "
                f"{len(cold.listed_ids):,} VMs in {cold.list_seconds:.1f} s, cache warm after "
                f"{cold.warm_seconds:.1f} s; server peak {cold.rss_after_list[1]:.0f} MiB once "
                f"listed, {peak:.0f} MiB once warm (VmRSS {cold.rss_after_warm[0]:.0f} MiB; "
                f"target < {TARGET_COLD_PEAK_MIB:g} MiB: {verdict})"
            )
        seen = sorted(report.outside_seconds)
        lines.append(
            "Another client's rename shown by Describe after "
            f"{statistics.median(seen) * 1000:.0f} ms median, "
            f"{seen[-1] * 1000:.0f} ms worst, of {len(seen)}"
        )
        at_target = report.answer_bytes * TARGET_VMS / size
        fit = at_target < MANAGER_MESSAGE_LIMIT
        fits = fits and fit
        how = "" if size == TARGET_VMS else f", {at_target:,.0f} B extrapolated to {TARGET_VMS:,}"
        lines.append(
            f"ListVMs answer at {size:,} VMs: {report.answer_bytes:,} B "
            f"({report.answer_bytes / size:.0f} B/VM{how}); manager limit "
            f"{MANAGER_MESSAGE_LIMIT:,} B: {'fits' if fit else 'OVER'}"
        )
    return lines, fits


def reproduce(args: Any) -> str:
    flags = [f"--sizes {','.join(map(str, args.sizes))}", f"--list-repeats {args.list_repeats}"]
    flags += [f"--describe-calls {args.describe_calls}", f"--naive-sample {args.naive_sample}"]
    flags += [f"--naive-describe-calls {args.naive_describe_calls}"]
    flags += [f"--page-size {args.page_size}"]
    return ".venv/bin/python bench/vsphere_bench.py " + " ".join(flags)


def sizes(text: str) -> list[int]:
    values = [int(n) for n in text.split(",")]
    if any(n < 2 or n % 2 for n in values):
        raise argparse.ArgumentTypeError("sizes are even (two resource pools share them)")
    return values


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--sizes", type=sizes, default=[10000], help="simulated VMs")
    parser.add_argument("--list-repeats", type=int, default=3, help="listings per way")
    parser.add_argument("--describe-calls", type=int, default=300, help="per way")
    parser.add_argument("--naive-sample", type=int, default=500, help="VMs the naive way lists")
    parser.add_argument("--naive-describe-calls", type=int, default=100)
    parser.add_argument(
        "--page-size", type=int, default=1000, help="maxObjects, as pyrigaud's own paging"
    )
    parser.add_argument(
        "--profile", action="store_true", help="cProfile list_vms() at the largest size"
    )
    parser.add_argument("--profile-top", type=int, default=25)
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args()

    def on_term(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    info = machine()
    print(", ".join(f"{k} {v}" for k, v in info.items()) + "\n")
    processes = Processes()
    reports: dict[int, SizeReport] = {}
    started = time.perf_counter()
    try:
        for size in args.sizes:
            reports[size] = bench_size(
                args, processes, size, args.profile and size == max(args.sizes)
            )
    finally:
        processes.stop_all()
    rows = [r for report in reports.values() for r in report.rows]
    print(table(rows) + "\n")
    lines, fits = verdicts(reports)
    print("\n".join(lines))
    print(f"\nReproduce ({time.perf_counter() - started:.0f} s here):\n\n{reproduce(args)}")
    profiles = [report.profile for report in reports.values() if report.profile]
    for profile in profiles:
        print("\n" + profile)
    if args.json:
        document = {"machine": info, "rows": [asdict(r) for r in rows], "verdicts": lines}
        document["profile"] = "\n".join(profiles)
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    return 0 if fits else 1


if __name__ == "__main__":
    raise SystemExit(main())
