"""The gRPC server: the Provider service, standard health, reflection, TLS, draining."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

HEALTH_SERVICES = ("", "provider")
# ListVMs of thousands of VMs can pass gRPC's 4 MiB default; the manager's own receive limit
# is what bounds it, so the server does not refuse to send a large answer.
_OPTIONS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", 16 * 1024 * 1024),
    ("grpc.so_reuseport", 0),
]


class ProviderServer:
    def __init__(
        self,
        servicer: pb_grpc.ProviderServicer,
        bind: str,
        credentials: grpc.ServerCredentials | None,
        workers: int,
    ) -> None:
        self._server = grpc.server(
            ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rpc"), options=_OPTIONS
        )
        pb_grpc.add_ProviderServicer_to_server(servicer, self._server)
        self._health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        service_names = (
            pb.DESCRIPTOR.services_by_name["Provider"].full_name,
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

    def wait(self) -> None:
        self._server.wait_for_termination()
