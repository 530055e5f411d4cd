"""The installed package serves on a read-only root filesystem as uid 65532, like the pod.

No container engine runs here, so the image's run-time assumptions are checked on the host: a
fresh venv made with the system interpreter and `pip install <repo>` (the Dockerfile's install),
made read-only, then `pyrigaud serve` run as uid 65532 in a private mount namespace where `/`
and the venv are remounted read-only and only /tmp stays writable (the pod's emptyDir), HOME
unwritable and cwd `/`. Needs root (for the mount namespace and the uid switch).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2_grpc as pb_grpc

from support.e2e import create_vm
from support.ports import free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: mount namespace and uid 65532"),
]

REPO = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = "/usr/bin/python3"
UNPRIVILEGED = 65532
PROBE = "/.pyrigaud-read-only-probe"
# Runs as root inside `unshare --mount` (a private copy of the mount table), then drops to the
# unprivileged uid. /tmp is bound onto itself first so remounting `/` read-only leaves it
# writable; the probe proves `/` really is read-only before the server starts.
READ_ONLY_LAUNCHER = f"""
set -eu
venv=$1; shift
mount --bind /tmp /tmp
mount --bind "$venv" "$venv"
mount -o remount,bind,ro "$venv"
mount -o remount,bind,ro /
if touch {PROBE} 2>/dev/null; then rm -f {PROBE}; echo "/ is still writable" >&2; exit 97; fi
exec setpriv --reuid={UNPRIVILEGED} --regid={UNPRIVILEGED} --clear-groups -- "$@"
"""


def tree_state(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under root with its (mtime_ns, size): any write changes it."""
    state = {}
    for directory, subdirectories, files in os.walk(root):
        for name in [*subdirectories, *files]:
            path = Path(directory, name)
            status = path.lstat()
            state[str(path.relative_to(root))] = (status.st_mtime_ns, status.st_size)
    return state


def footprint_mib(root: Path) -> float:
    return sum(path.lstat().st_size for path in root.rglob("*")) / 2**20


@pytest.fixture(scope="module")
def read_only_venv() -> Iterator[Path]:
    """A venv with pyrigaud installed as the image installs it, then made read-only."""
    base = Path(tempfile.mkdtemp(prefix="pyrigaud-ro-", dir="/tmp"))
    base.chmod(0o755)  # the unprivileged uid must traverse it
    venv = base / "venv"
    environment = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    try:
        subprocess.run([SYSTEM_PYTHON, "-m", "venv", str(venv)], check=True, timeout=120)
        subprocess.run(
            [str(venv / "bin/python"), "-m", "pip", "install", "-qq", str(REPO)],
            check=True,
            timeout=600,
            env=environment,
        )
        subprocess.run(["chmod", "-R", "a-w", str(venv)], check=True, timeout=60)
        yield venv
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(base)], check=False, timeout=60)
        shutil.rmtree(base)


def wait_for_healthz(health_port: int, server: subprocess.Popen[str], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"pyrigaud exited early: {server.communicate(timeout=10)}")
        try:
            url = f"http://127.0.0.1:{health_port}/healthz"
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            time.sleep(0.05)
    raise AssertionError(f"/healthz did not answer 200 within {seconds} s")


def wait_for_serving(channel: grpc.Channel, server: subprocess.Popen[str], seconds: float) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"pyrigaud exited early: {server.communicate(timeout=10)}")
        try:
            # types-grpcio-health-checking declares no methods on HealthStub.
            check = health.Check  # type: ignore[attr-defined]
            reply = check(health_pb2.HealthCheckRequest(service="provider"), timeout=2)
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                return
        except grpc.RpcError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"the provider health service was not SERVING within {seconds} s")


def effective_uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[2])
    raise AssertionError(f"no Uid line for pid {pid}")


def test_installed_server_serves_and_drains_on_a_read_only_root_as_uid_65532(
    read_only_venv: Path,
) -> None:
    before = tree_state(read_only_venv)
    port, health_port = free_port(), free_port()
    started = time.monotonic()
    server = subprocess.Popen(
        [
            "unshare",
            "--mount",
            "/bin/sh",
            "-c",
            READ_ONLY_LAUNCHER,
            "launcher",
            str(read_only_venv),
            str(read_only_venv / "bin/pyrigaud"),
            "serve",
            f"--port={port}",
            f"--health-port={health_port}",
            "--listen-address",
            "127.0.0.1",
        ],
        env={
            "PATH": f"{read_only_venv}/bin:/usr/bin:/bin",
            "HOME": "/nonexistent",
            "PYTHONDONTWRITEBYTECODE": "1",
            "VIRTRIGAUD_PROVIDER_INSECURE": "true",
            "PROVIDER_TYPE": "fake",
            "PYRIGAUD_TLS_DIR": "/nonexistent/tls",
        },
        cwd="/",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            wait_for_serving(channel, server, seconds=60)
            to_serving = time.monotonic() - started
            wait_for_healthz(health_port, server, seconds=30)
            assert effective_uid(server.pid) == UNPRIVILEGED
            stub = pb_grpc.ProviderStub(channel)
            assert stub.Validate(pb.ValidateRequest(), timeout=10).ok
            vm_id = create_vm(stub, "read-only-root")
            described = stub.Describe(pb.DescribeRequest(id=vm_id), timeout=10)
            assert described.exists
        server.send_signal(signal.SIGTERM)
        _, stderr = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate(timeout=10)
    assert server.returncode == 0, stderr
    for complaint in ("Read-only file system", "Permission denied", "Traceback"):
        assert complaint not in stderr, stderr
    assert "pyrigaud stopped" in stderr
    assert tree_state(read_only_venv) == before, "the install changed while serving"
    print(
        f"\ninstalled footprint {footprint_mib(read_only_venv):.1f} MiB "
        f"(fake backend, no extras); process start to SERVING {to_serving:.2f} s"
    )
