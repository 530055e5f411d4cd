"""The HTTP side of the health port: /healthz, /readyz and /health for kubelet and humans,
and /metrics for Prometheus.

Readiness never depends on the hypervisor: an outage must not remove the provider's
endpoints, or the manager could not even call Validate, which is where outages are shown.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pyrigaud.entrypoints.metrics import Metrics

logger = logging.getLogger(__name__)


class Readiness:
    """Serving state shared by the gRPC health service and the HTTP probes."""

    def __init__(self, provider_type: str) -> None:
        self.provider_type = provider_type
        self._ready = threading.Event()

    def set_ready(self, ready: bool) -> None:
        if ready:
            self._ready.set()
        else:
            self._ready.clear()

    @property
    def ready(self) -> bool:
        return self._ready.is_set()


class _DualStackServer(ThreadingHTTPServer):
    """Listens on IPv6 and IPv4 at once when bound to "::" (all interfaces)."""

    daemon_threads = True
    address_family = socket.AF_INET6

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


class _IPv4Server(ThreadingHTTPServer):
    daemon_threads = True


def _handler(readiness: Readiness, metrics: Metrics | None) -> type[BaseHTTPRequestHandler]:
    class HealthHandler(BaseHTTPRequestHandler):
        server_version = "pyrigaud"
        sys_version = ""

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                self._reply(200, "text/plain", b"ok")
            elif path == "/readyz":
                ready = readiness.ready
                self._reply(
                    200 if ready else 503, "text/plain", b"ready" if ready else b"not ready"
                )
            elif path == "/health":
                body: dict[str, Any] = {
                    "status": "ok",
                    "ready": readiness.ready,
                    "provider_type": readiness.provider_type,
                }
                self._reply(200, "application/json", json.dumps(body).encode())
            elif path == "/metrics" and metrics is not None:
                page, content_type = metrics.exposition(self.headers.get("Accept", ""))
                self._reply(200, content_type, page)
            else:
                self._reply(404, "text/plain", b"not found")

        def _reply(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("health %s", format % args)

    return HealthHandler


class HealthServer:
    """Serves the probes, and /metrics when given `metrics`, from a background thread."""

    def __init__(
        self,
        listen_address: str,
        port: int,
        readiness: Readiness,
        metrics: Metrics | None = None,
    ) -> None:
        handler = _handler(readiness, metrics)
        self._server: ThreadingHTTPServer
        if listen_address in ("", "::", "[::]"):
            try:
                self._server = _DualStackServer(("::", port), handler)
            except OSError:  # no IPv6 on this host
                self._server = _IPv4Server(("0.0.0.0", port), handler)  # noqa: S104 - by design
        else:
            host = listen_address.strip("[]")
            server_type = _DualStackServer if ":" in host else _IPv4Server
            self._server = server_type((host, port), handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="health-http", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
