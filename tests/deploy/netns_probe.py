"""What the manager and the kubelet ask of a pod, asked from inside its network namespace.

test_container_image.py runs this under `nsenter --net=<the container's namespace>`: the
container has nothing but loopback, so only a process in its namespace reaches its ports.
Waits for /healthz, then sends Validate and ListVMs with the manager's client certificate over
mutual TLS (the project's client), and prints what it saw as one JSON object.

Usage: netns_probe.py GRPC_PORT HEALTH_PORT CLIENT_TLS_DIR SERVER_NAME
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from pyrigaud.client.connection import DEADLINES, Target, open_channel, stub_for
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb

READY_SECONDS = 60.0


def wait_for_healthz(health_port: int) -> tuple[int, str]:
    url = f"http://127.0.0.1:{health_port}/healthz"
    deadline = time.monotonic() + READY_SECONDS
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.status, response.read().decode()
        except (OSError, urllib.error.URLError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def main(grpc_port: str, health_port: str, tls_dir: str, server_name: str) -> None:
    status, body = wait_for_healthz(int(health_port))
    target = Target(f"127.0.0.1:{grpc_port}", Path(tls_dir), server_name)
    with open_channel(target) as channel:
        stub = stub_for(channel)
        validated = stub.Validate(pb.ValidateRequest(), timeout=DEADLINES["Validate"])
        listed = stub.ListVMs(pb.ListVMsRequest(), timeout=DEADLINES["ListVMs"])
    seen = {
        "healthz": {"status": status, "body": body},
        "validate": {"ok": validated.ok, "message": validated.message},
        "vms": sorted(vm.name for vm in listed.vms),
    }
    print(json.dumps(seen))


if __name__ == "__main__":
    main(*sys.argv[1:])
