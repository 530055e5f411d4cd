"""Replicas of `pyrigaud serve` as real processes sharing one hypervisor and nothing else."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from prometheus_client.parser import text_string_to_metric_families

from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2_grpc as pb_grpc

from support.ports import free_port

PYRIGAUD = [sys.executable, "-m", "pyrigaud.entrypoints.cli"]
READY_SECONDS = 30
NAME_PREFIX = "replica-"  # every VM the replica tests make; teardown deletes these


class Replica:
    """One `pyrigaud serve` on free loopback ports; `restart` keeps its settings, not its ports.
    `command` runs pyrigaud (the code under test by default; an earlier release's, e.g.)."""

    def __init__(
        self, environ: dict[str, str], home: Path, command: Sequence[str] = PYRIGAUD
    ) -> None:
        self._environ = environ
        self._command = list(command)
        self._home = home
        home.mkdir(parents=True, exist_ok=True)
        self.log_path = home / "serve.log"
        self._popen, self._channel, self.stub = self._start()

    def _start(self) -> tuple[subprocess.Popen[str], grpc.Channel, pb_grpc.ProviderStub]:
        port, health_port = free_port(), free_port()
        self.health_url = f"http://127.0.0.1:{health_port}"  # /healthz, /readyz, /metrics
        with self.log_path.open("a") as log:  # a file, not a pipe nobody drains
            popen = subprocess.Popen(
                [
                    *self._command,
                    "serve",
                    f"--port={port}",
                    f"--health-port={health_port}",
                    "--listen-address=127.0.0.1",
                ],
                env={
                    "PATH": os.environ.get("PATH", ""),
                    # The code under test where the dev loop puts it (else the installed copy).
                    "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
                    "HOME": str(self._home),
                    "VIRTRIGAUD_PROVIDER_INSECURE": "true",
                    "PYRIGAUD_TLS_DIR": str(self._home / "no-tls"),
                    "LOG_FORMAT": "json",
                    # The tests' staging stores (moto, nfs-ganesha) listen on loopback.
                    "PYRIGAUD_STAGING_ALLOW_LOOPBACK": "true",
                    **self._environ,
                },
                stdout=subprocess.DEVNULL,
                stderr=log,
                text=True,
            )
        _wait_ready(popen, health_port, self.log_path)
        self._health_port = health_port
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        return popen, channel, pb_grpc.ProviderStub(channel)

    def stop(self) -> int:
        """SIGTERM (the orchestrator's way), wait for the drain, return the exit code."""
        self._channel.close()
        if self._popen.poll() is None:
            self._popen.send_signal(signal.SIGTERM)
        try:
            self._popen.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            self._popen.kill()
            self._popen.communicate(timeout=10)
        return self._popen.returncode

    def kill(self) -> None:
        """SIGKILL: no drain, no cleanup, as when a node dies or the OOM killer strikes."""
        self._popen.kill()
        self._popen.communicate(timeout=10)
        self._channel.close()

    def logged(self, text: str, seconds: float) -> bool:
        """Whether the process writes `text` to its log within `seconds`."""
        deadline = time.monotonic() + seconds
        while text not in self.log_path.read_text():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True

    def metric(self, sample: str, **labels: str) -> float:
        """The sum of the process's `/metrics` samples named `sample` whose labels include
        `labels` (0 when there is none yet), e.g. the bytes a transfer has moved so far."""
        url = f"http://127.0.0.1:{self._health_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        return sum(
            found.value
            for family in text_string_to_metric_families(text)
            for found in family.samples
            if found.name == sample and labels.items() <= found.labels.items()
        )

    @property
    def pid(self) -> int:
        return self._popen.pid

    def restart(self) -> int:
        code = self.stop()
        self._popen, self._channel, self.stub = self._start()
        return code


def _wait_ready(popen: subprocess.Popen[str], health_port: int, log_path: Path) -> None:
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            raise AssertionError(f"pyrigaud exited early: {log_path.read_text()[-4000:]}")
        try:
            url = f"http://127.0.0.1:{health_port}/readyz"
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except (OSError, urllib.error.HTTPError):
            pass
        time.sleep(0.1)
    popen.kill()
    popen.communicate(timeout=10)
    raise AssertionError(f"pyrigaud did not become ready in {READY_SECONDS} s")


@dataclass
class Pair:
    """Replicas A and B sharing a hypervisor and the ownership mark; `image_json` fits it.
    `guest_obeys_shutdown`: vcsim's simulated guest powers off at once on a guest shutdown,
    while a QEMU guest without an OS ignores ACPI, so only there the deadline fallback shows."""

    backend: str
    a: Replica
    b: Replica
    image_json: str
    guest_obeys_shutdown: bool


def listed_vms(stub: pb_grpc.ProviderStub) -> list[pb.VMInfo]:
    """ListVMs, asked again (bounded) when it fails NOT_FOUND: the libvirt adapter's list_vms
    fails whole when another suite's domain vanishes mid-listing on the shared daemon."""
    for _ in range(4):
        try:
            return list(stub.ListVMs(pb.ListVMsRequest(), timeout=30).vms)
        except grpc.RpcError as error:
            if error.code() is not grpc.StatusCode.NOT_FOUND:
                raise
            time.sleep(0.5)
    return list(stub.ListVMs(pb.ListVMsRequest(), timeout=30).vms)
