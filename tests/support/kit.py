"""The operator's kit under test: `pyrigaud serve` processes to point it at, and the kit's
own commands run as an operator runs them (a process, output and exit code)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc

from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2_grpc as pb_grpc

from support.ports import free_port

PYRIGAUD = [sys.executable, "-m", "pyrigaud.entrypoints.cli"]


@dataclass(frozen=True)
class Served:
    endpoint: str
    popen: subprocess.Popen[str]
    health_port: int


@contextmanager
def served(env: dict[str, str], tmp_path: Path) -> Iterator[Served]:
    """`pyrigaud serve` on loopback with `env` (plaintext unless env says TLS), ready, then
    stopped with SIGTERM."""
    port, health_port = free_port(), free_port()
    popen = subprocess.Popen(
        [*PYRIGAUD, "serve", f"--port={port}", f"--health-port={health_port}"],
        env={
            "PATH": os.environ.get("PATH", ""),
            # The pyrigaud this test imports, where a path chooses it over the installed one.
            **{key: os.environ[key] for key in ("PYTHONPATH",) if key in os.environ},
            "HOME": str(tmp_path),
            "PYRIGAUD_LISTEN_ADDRESS": "127.0.0.1",
            "VIRTRIGAUD_PROVIDER_INSECURE": "true",
            "PYRIGAUD_TLS_DIR": str(tmp_path / "no-tls"),
            # The tests' staging stores (moto, nfs-ganesha) listen on loopback.
            "PYRIGAUD_STAGING_ALLOW_LOOPBACK": "true",
            **env,
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_ready(popen, health_port)
        yield Served(f"127.0.0.1:{port}", popen, health_port)
    finally:
        popen.send_signal(signal.SIGTERM)
        try:
            popen.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.communicate()


def _wait_ready(popen: subprocess.Popen[str], health_port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            raise AssertionError(f"pyrigaud serve exited early: {popen.communicate()[1]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/readyz", timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("pyrigaud serve did not become ready in 30 s")


def kit(*arguments: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """One `pyrigaud` kit command, bounded by a timeout, its output captured."""
    return subprocess.run(
        [*PYRIGAUD, *arguments],
        env={"PATH": os.environ.get("PATH", ""), **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def names_listed(endpoint: str) -> set[str]:
    with grpc.insecure_channel(endpoint) as channel:
        listed = pb_grpc.ProviderStub(channel).ListVMs(pb.ListVMsRequest(), timeout=30)
    return {vm.name for vm in listed.vms}
