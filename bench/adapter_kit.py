"""What a bench needs to time the disk use cases in this process, on the adapters themselves: a
libvirt pool of its own, a PVC staging folder, and the clock and RSS around each transfer.

migration_bench.py times the manager's path over gRPC against served providers and measures
their processes; a bench that compares one conversion with the tool doing the same conversion
(image_bench.py) wants the use cases in its own process instead, with nothing of the wire's
polling in its times.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from returns.result import Failure, Result

from pyrigaud.domain.errors import ProviderError

from support.qemu import QEMU_URI, ensure_dir_pool, open_qemu, remove_pool_leftovers

URI = QEMU_URI
POOL = "pyrigaud-bench-images"
POOL_PATH = Path("/var/lib/pyrigaud-test/bench-images")
OWNER = "bench/images"  # the owner mark of the staged temporaries and the VMs the bench makes
MiB = 1024**2
CHUNK = 4 * MiB

T = TypeVar("T")


@dataclass(frozen=True)
class PvcFolder:
    """A migration's folder on the PVC staging, as the manager names it: files in `folder`,
    the same files as `url(name)` says them to ExportDisk and ImportDisk."""

    root: Path  # the staging root (the provider's PYRIGAUD_MIGRATION_STORAGE_ROOT)

    @property
    def folder(self) -> Path:
        return self.root / "mig" / "vmmigrations" / "ns" / "bench"

    def url(self, name: str) -> str:
        return f"pvc://mig/vmmigrations/ns/bench/{name}"


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def measured(action: Callable[[], T]) -> tuple[float, float, T]:
    """Seconds, RSS growth in bytes (peak during, sampled every 50 ms, minus before) and the
    action's value."""
    before = rss_bytes()
    peak = before
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.05):
            peak = max(peak, rss_bytes())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    try:
        value = action()
    finally:
        took = time.perf_counter() - started
        done.set()
        sampler.join()
    return took, max(peak, rss_bytes()) - before, value


def unwrapped(result: Result[T, ProviderError]) -> T:
    """The success, or the bench stops: a failed transfer has no time worth reporting."""
    if isinstance(result, Failure):
        raise RuntimeError(f"failed: {result.failure()}")
    return result.unwrap()


@contextmanager
def bench_pool() -> Iterator[tuple[Any, Any]]:
    """A raw libvirt connection and the bench's dir pool on it; afterwards every domain with a
    disk in the pool, every volume and the pool itself are gone."""
    conn = open_qemu()
    try:
        pool = ensure_dir_pool(conn, POOL, POOL_PATH)
        try:
            yield conn, pool
        finally:
            remove_pool_leftovers(conn, POOL, POOL_PATH)
            pool.destroy()
            pool.undefine()
            shutil.rmtree(POOL_PATH, ignore_errors=True)
    finally:
        conn.close()
