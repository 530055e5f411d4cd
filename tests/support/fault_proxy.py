"""A TCP proxy on loopback in front of a server the tests started, that fails like a network:
once a given number of bytes has passed (either way, so a fault lands mid-request or
mid-download), it cuts every connection (a reset) and, for an outage, closes its port for some
seconds (connections are refused), then listens again on the same port."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from support.ports import free_port

RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: the close after a cut sends a reset


@dataclass
class FaultProxy:
    target_port: int
    # Outside the ephemeral range: after an outage it listens on it again, and in between no
    # outgoing connection may have taken it as its local port.
    port: int = field(default_factory=free_port)
    relayed: int = 0  # bytes passed so far, both ways
    outage_began: float | None = None  # time.monotonic() of the last fault
    outage_ended: float | None = None
    _fault_at: int | None = None  # `relayed` at which to fail
    _refuse_seconds: float = 0.0
    _down_until: float = 0.0
    _connections: set[socket.socket] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _listener: socket.socket | None = None
    _stopped: bool = False

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fail_after(self, more_bytes: int, refuse_seconds: float = 0.0) -> None:
        """Once `more_bytes` more have passed: cut every connection, and refuse new ones for
        `refuse_seconds` (0: a cut, the port stays open)."""
        with self._lock:
            self._fault_at = self.relayed + more_bytes
            self._refuse_seconds = refuse_seconds
            self.outage_began = self.outage_ended = None

    def end_outage(self) -> None:
        """Listen again now, whatever was left of the outage's seconds."""
        with self._lock:
            self._down_until = 0.0

    def wait_until_back(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.outage_began is None or self.outage_ended is None:
            assert time.monotonic() < deadline, "the outage never ended"
            time.sleep(0.05)

    def _passed(self, count: int) -> None:
        with self._lock:
            self.relayed += count
            if self._fault_at is None or self.relayed < self._fault_at:
                return
            self._fault_at = None
            now = time.monotonic()
            self.outage_began = now
            self._down_until = now + self._refuse_seconds
            if self._refuse_seconds > 0 and self._listener is not None:
                self._listener.close()  # refused from now on
                self._listener = None
            else:
                self.outage_ended = now
            cut, self._connections = self._connections, set()
        for connection in cut:  # shut down, which wakes the pumps blocked on it; they close
            with contextlib.suppress(OSError):
                connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET)
                connection.shutdown(socket.SHUT_RDWR)

    def _listen(self) -> socket.socket:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        listener.settimeout(0.05)
        return listener

    def _serve(self) -> None:
        while not self._stopped:
            with self._lock:
                listener = self._listener
                down_for = self._down_until - time.monotonic()
            if listener is None:
                if down_for > 0:
                    time.sleep(min(down_for, 0.05))
                    continue
                listener = self._listen()
                with self._lock:
                    self._listener = listener
                    self.outage_ended = time.monotonic()
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:  # closed by a fault
                continue
            self._relay(client)

    def _relay(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=10)
        except OSError:
            client.close()
            return
        client.settimeout(None)
        upstream.settimeout(None)
        with self._lock:
            self._connections |= {client, upstream}
        for source, sink in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
                self._passed(len(data))
        except OSError:
            pass
        finally:
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._connections -= {source, sink}
            source.close()

    def start(self) -> threading.Thread:
        self._listener = self._listen()
        thread = threading.Thread(target=self._serve, daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stopped = True
        with self._lock:
            if self._listener is not None:
                self._listener.close()
            cut, self._connections = self._connections, set()
        for connection in cut:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


@contextmanager
def fault_proxy(target_endpoint: str) -> Iterator[FaultProxy]:
    """A FaultProxy in front of `target_endpoint` (http://127.0.0.1:port)."""
    proxy = FaultProxy(target_port=int(target_endpoint.rsplit(":", 1)[1]))
    thread = proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()
        thread.join(5)
