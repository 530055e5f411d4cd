"""The gRPC server: the Provider service, standard health, reflection, TLS, draining."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import cast

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from pyrigaud.entrypoints.grpc.interceptors import ProviderLayers
from pyrigaud.entrypoints.grpc.servicer import SERVICE, AnyRpc, method_handlers
from pyrigaud.entrypoints.grpc.workers import RpcWorkers

logger = logging.getLogger(__name__)

HEALTH_SERVICES = ("", "provider")
# ListVMs of thousands of VMs can pass gRPC's 4 MiB default; the manager's own receive limit
# is what bounds it, so the server does not refuse to send a large answer.
_OPTIONS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", 16 * 1024 * 1024),
    ("grpc.so_reuseport", 0),
]


@dataclass(frozen=True)
class ProviderService:
    """The Provider service: its RPC table and the layers every RPC goes through."""

    rpcs: tuple[AnyRpc, ...]
    layers: ProviderLayers


class ProviderServer:
    def __init__(
        self,
        service: ProviderService,
        bind: str,
        credentials: grpc.ServerCredentials | None,
        workers: int,
    ) -> None:
        self._workers = RpcWorkers(workers, name_prefix="rpc")
        # grpcio types its pool as a ThreadPoolExecutor but only submits to it (workers.py).
        self._server = grpc.server(cast(ThreadPoolExecutor, self._workers), options=_OPTIONS)
        handlers = method_handlers(service.rpcs, service.layers.wrap)
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, handlers),)
        )
        self._server.add_registered_method_handlers(SERVICE, handlers)
        self._health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        service_names = (
            SERVICE,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        )
        reflection.enable_server_reflection(service_names, self._server)
        if credentials is None:
            self.port = self._server.add_insecure_port(bind)
        else:
            self.port = self._server.add_secure_port(bind, credentials)
        if self.port == 0:
            raise OSError(f"cannot listen on {bind} for gRPC")

    def start(self) -> None:
        self._server.start()
        for service in HEALTH_SERVICES:
            self._health.set(service, health_pb2.HealthCheckResponse.SERVING)

    def stop(self, grace_seconds: float) -> None:
        """NOT_SERVING first, then refuse new RPCs and let in-flight ones finish."""
        self._health.enter_graceful_shutdown()
        self._server.stop(grace_seconds).wait()
        self._workers.shutdown()

    def wait(self) -> None:
        self._server.wait_for_termination()
