"""A real HTTP server on 127.0.0.1 that serves disk images, and images made with qemu-img.

Tests give the adapter loopback URLs only (allowed by its `allow_loopback_urls`), never a
name that needs real DNS; `requests` shows what reached the server, so a refusal can be
shown to have sent no traffic.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HOLD_SECONDS = 60  # a held request gives up waiting after this, so a failed test ends


@dataclass
class ImageServer:
    base: str
    images: dict[str, bytes]  # by request path, e.g. "/disk.qcow2"; others answer 404
    requests: list[str] = field(default_factory=list)
    # While `held` is set, a request waits for `release` between its headers and its body.
    held: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    arrived: threading.Event = field(default_factory=threading.Event)

    def url(self, path: str) -> str:
        return f"{self.base}{path}"


@contextmanager
def serving(images: dict[str, bytes]) -> Iterator[ImageServer]:
    """The server, running in a thread for the block; each image sent with its length."""
    server = ImageServer(base="", images=images)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            server.requests.append(self.path)
            body = server.images.get(self.path)
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            server.arrived.set()
            if server.held.is_set():
                server.release.wait(HOLD_SECONDS)
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            return

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.base = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


def raw_image(size_bytes: int) -> bytes:
    """A raw disk whose every 4 KiB block says which block it is: content is checkable."""
    blocks = size_bytes // 4096
    return b"".join(f"block {index:08d} ".encode().ljust(4096, b".") for index in range(blocks))


def qcow2_of(raw: bytes, workdir: Path, *options: str) -> bytes:
    """The raw disk converted to qcow2 by qemu-img (with extra `-o` options if given)."""
    source, target = workdir / "source.raw", workdir / "converted.qcow2"
    source.write_bytes(raw)
    extra = ["-o", ",".join(options)] if options else []
    subprocess.run(
        ["qemu-img", "convert", "-f", "raw", "-O", "qcow2", *extra, str(source), str(target)],
        check=True,
    )
    return target.read_bytes()


def qcow2_backed_by(backing: Path, workdir: Path) -> bytes:
    """A qcow2 overlay whose header names `backing`, a file of this host."""
    target = workdir / "overlay.qcow2"
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(backing), "-F", "raw", str(target)],
        check=True,
    )
    return target.read_bytes()
