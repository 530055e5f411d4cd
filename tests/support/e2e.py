"""End-to-end helpers: a real pyrigaud gRPC server on loopback, on the fake backend."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from pyrigaud.adapters.clocks import SystemClock
from pyrigaud.adapters.hypervisors.fake.backend import fake_backend
from pyrigaud.adapters.hypervisors.fake.hypervisor import FakeHypervisor
from pyrigaud.adapters.staging.registry import STAGING_TYPES
from pyrigaud.entrypoints.bootstrap import Application, bootstrap
from pyrigaud.entrypoints.container import ServerTransport
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2_grpc as pb_grpc
from pyrigaud.entrypoints.settings import load_settings

from support import ManualClock, ok


@dataclass
class RunningProvider:
    stub: pb_grpc.ProviderStub
    channel: grpc.Channel
    fake: FakeHypervisor
    clock: ManualClock
    application: Application
    address: str


def start_provider(
    environ: dict[str, str] | None = None,
    shared_with: RunningProvider | None = None,
    credentials: grpc.ServerCredentials | None = None,
    channel: Callable[[str], grpc.Channel] = grpc.insecure_channel,
    clock: ManualClock | None = None,
    **overrides: object,
) -> RunningProvider:
    """A server on a free loopback port (its health endpoint too); `shared_with` makes it a
    second replica on the same hypervisor and clock (replicas share nothing else); `clock`
    is its time (a new ManualClock by default); `overrides` replace more of the container's
    providers (bootstrap's overrides)."""
    settings = load_settings(
        {
            "PYRIGAUD_LISTEN_ADDRESS": "127.0.0.1",
            "PYRIGAUD_PORT": "0",
            "PYRIGAUD_HEALTH_PORT": "0",
            "PROVIDER_TYPE": "fake",
            "PYRIGAUD_STAGING_ALLOW_LOOPBACK": "true",
            **(environ or {}),
        },
        staging_types=STAGING_TYPES,
    )
    if shared_with is None:
        clock = clock or ManualClock()
        fake = FakeHypervisor(clock, guest_shutdown_seconds=5, latency_clock=SystemClock())
        fake.add_image("/images/base.qcow2")
    else:
        clock, fake = shared_with.clock, shared_with.fake
    replaced: dict[str, object] = {"clock": clock, "server_transport": ServerTransport(credentials)}
    if settings.provider_type == "fake":  # other backends (libvirt, vSphere) serve as configured
        replaced["backend"] = fake_backend(fake)
    application = ok(bootstrap(settings, **replaced, **overrides))
    application.start()
    address = f"127.0.0.1:{application.grpc_port}"
    opened = channel(address)
    return RunningProvider(
        stub=pb_grpc.ProviderStub(opened),
        channel=opened,
        fake=fake,
        clock=clock,
        application=application,
        address=address,
    )


CLASS_JSON = json.dumps(
    {
        "CPU": 2,
        "MemoryMiB": 1024,
        "Firmware": "",
        "DiskDefaults": None,
        "ExtraConfig": None,
        "PerformanceProfile": None,
        "SecurityProfile": None,
        "ResourceLimits": None,
    }
)


def create_vm(stub: pb_grpc.ProviderStub, name: str, **fields: object) -> str:
    """Create through gRPC as the manager does (Go-shaped JSON) and return the id."""
    defaults: dict[str, object] = {
        "class_json": CLASS_JSON,
        "image_json": "null",
        "networks_json": "null",
        "disks_json": "null",
    }
    request = pb.CreateRequest(name=name, **{**defaults, **fields})  # type: ignore[arg-type]
    return stub.Create(request, timeout=10).id
