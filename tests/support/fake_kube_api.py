"""A loopback stand-in for the Kubernetes API server's core/v1 Secret endpoints.

It serves exactly what the official client sends for one Secret (logged in `requests`):
`GET /api/v1/namespaces/{ns}/secrets/{name}` and the watch
`GET /api/v1/namespaces/{ns}/secrets?fieldSelector=metadata.name%3D{name}&resourceVersion=N
&timeoutSeconds=T&watch=true`, answered like the real server: a chunked stream of
newline-delimited `{"type": ..., "object": <Secret>}` events after version N, ending after T
seconds. Errors are `Status` objects with the real reasons and codes.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

_LONGEST_WATCH_S = 60.0
_POLL_S = 0.05


@dataclass(frozen=True)
class _Event:
    resource_version: int
    type: str
    secret: dict[str, Any]


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class FakeKubeApi:
    """Start with `with FakeKubeApi() as api:`; `api.host` goes into client.Configuration."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self._secrets: dict[tuple[str, str], dict[str, Any]] = {}
        self._events: list[_Event] = []
        self._resource_version = 100
        self._failing: HTTPStatus | None = None
        self._changed = threading.Condition()
        self._port = 0
        self._server: ThreadingHTTPServer | None = None
        self._serving: threading.Thread | None = None

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def start(self) -> None:
        """Listen (again, on the same port after stop(): the client keeps its address)."""
        handler = type("Handler", (_Handler,), {"api": self})
        server = ThreadingHTTPServer(("127.0.0.1", self._port), handler)
        server.daemon_threads = True
        self._port = server.server_address[1]
        self._server = server
        self._serving = threading.Thread(target=server.serve_forever, daemon=True)
        self._serving.start()

    def stop(self) -> None:
        """Refuse connections from now on; open watches end."""
        server, self._server = self._server, None
        with self._changed:
            self._changed.notify_all()
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._serving is not None:
            self._serving.join(timeout=5)

    def __enter__(self) -> FakeKubeApi:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def put_secret(self, namespace: str, name: str, values: Mapping[str, str]) -> None:
        with self._changed:
            self._resource_version += 1
            is_new = (namespace, name) not in self._secrets
            secret = {
                "kind": "Secret",
                "apiVersion": "v1",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "uid": f"uid-{namespace}-{name}",
                    "resourceVersion": str(self._resource_version),
                    "creationTimestamp": "2026-12-02T12:00:00Z",
                },
                "data": {
                    key: base64.b64encode(value.encode()).decode() for key, value in values.items()
                },
                "type": "Opaque",
            }
            self._secrets[namespace, name] = secret
            self._record("ADDED" if is_new else "MODIFIED", secret)

    def delete_secret(self, namespace: str, name: str) -> None:
        with self._changed:
            self._resource_version += 1
            self._record("DELETED", self._secrets.pop((namespace, name)))

    def fail_with(self, status: HTTPStatus | None) -> None:
        """Answer every request with this error Status (None: serve normally); watches end."""
        with self._changed:
            self._failing = status
            self._changed.notify_all()

    def watch_requests(self) -> list[str]:
        return [path for path in self.requests if "watch=true" in path]

    def _record(self, event_type: str, secret: dict[str, Any]) -> None:
        self._events.append(_Event(self._resource_version, event_type, secret))
        self._changed.notify_all()

    def _secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._changed:
            return self._secrets.get((namespace, name))

    def _events_after(
        self, namespace: str, name: str, since: int, deadline: float
    ) -> list[_Event] | None:
        """Events for that Secret newer than `since`; [] at the deadline, None when failing."""
        with self._changed:
            while True:
                if self._failing is not None or self._server is None:
                    return None
                events = [
                    event
                    for event in self._events
                    if event.resource_version > since
                    and event.secret["metadata"]["namespace"] == namespace
                    and event.secret["metadata"]["name"] == name
                ]
                remaining = deadline - time.monotonic()
                if events or remaining <= 0:
                    return events
                self._changed.wait(min(remaining, _POLL_S))


class _Handler(BaseHTTPRequestHandler):
    api: FakeKubeApi
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the request log is `api.requests`."""

    def do_GET(self) -> None:
        if self.server is not self.api._server:  # stopped: a kept-alive connection dies too
            self.close_connection = True
            return
        self.api.requests.append(self.path)
        failing = self.api._failing
        if failing is not None:
            self._send_json(failing, status_body(failing, failing.phrase, "injected failure"))
            return
        url = urlsplit(self.path)
        parts = url.path.strip("/").split("/")
        query = {key: values[-1] for key, values in parse_qs(url.query).items()}
        match parts:
            case ["api", "v1", "namespaces", namespace, "secrets", name]:
                self._get(namespace, name)
            case ["api", "v1", "namespaces", namespace, "secrets"] if query.get("watch") == "true":
                self._watch(namespace, query)
            case _:
                self._send_json(
                    HTTPStatus.NOT_FOUND,
                    status_body(404, "NotFound", f"the fake does not serve {url.path}"),
                )

    def _get(self, namespace: str, name: str) -> None:
        secret = self.api._secret(namespace, name)
        if secret is None:
            self._send_json(
                HTTPStatus.NOT_FOUND,
                status_body(404, "NotFound", f'secrets "{name}" not found'),
            )
        else:
            self._send_json(HTTPStatus.OK, secret)

    def _watch(self, namespace: str, query: dict[str, str]) -> None:
        field, _, name = query.get("fieldSelector", "").partition("=")
        since_text = query.get("resourceVersion", "")
        if field != "metadata.name" or not name or not since_text.isdigit():
            message = "the fake watches one metadata.name from a resourceVersion only"
            self._send_json(HTTPStatus.BAD_REQUEST, status_body(400, "BadRequest", message))
            return
        deadline = time.monotonic() + min(
            float(query.get("timeoutSeconds", _LONGEST_WATCH_S)), _LONGEST_WATCH_S
        )
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        since = int(since_text)
        while events := self.api._events_after(namespace, name, since, deadline):
            for event in events:
                self._send_chunk({"type": event.type, "object": event.secret})
            since = events[-1].resource_version
        self.wfile.write(b"0\r\n\r\n")

    def _send_chunk(self, event: dict[str, Any]) -> None:
        line = json.dumps(event).encode() + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
        self.wfile.flush()

    def _send_json(self, status: HTTPStatus, body: dict[str, Any]) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
