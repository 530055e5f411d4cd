"""The image the Dockerfile builds, run the way the manager's pod runs it.

scripts/container-image.sh builds it with buildah (on a debootstrap base where Docker Hub is
out of reach; docs/container.md). podman then runs it under the pod's constraints: the
manager's arguments and env (deploy/*/provider.yaml, deploy/standalone/deployment.yaml), uid
65532, a read-only root with /tmp a tmpfs, the TLS Secret mounted read-only, no capability, no
privilege gain, and a network namespace of its own with nothing but loopback, so the server can
reach nothing else. tests/deploy/netns_probe.py asks from inside that namespace: /healthz, then
Validate and ListVMs over mutual TLS with the manager's certificate, on the libvirt test driver.
SIGTERM must then stop it with exit code 0 within a few seconds. Needs root.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.pki import Authority, mount_secret

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: buildah, podman and nsenter"),
]

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "container-image.sh"
PROBE = Path(__file__).with_name("netns_probe.py")
ENGINE = {
    "CONTAINERS_STORAGE_CONF": str(REPO / "tools/container-engine/storage.conf"),
    "CONTAINERS_CONF": str(REPO / "tools/container-engine/containers.conf"),
}
UNPRIVILEGED = 65532
GRPC_PORT, HEALTH_PORT = 9443, 8080  # what the manager passes: nothing else binds in there
TLS_DIR = "/etc/virtrigaud/tls"
# The manager's env for a libvirt Provider, the hypervisor being libvirt's built-in test driver.
MANAGER_ENV = {
    "PROVIDER_TYPE": "libvirt",
    "PROVIDER_ENDPOINT": "test:///default",
    "PROVIDER_NAMESPACE": "virtrigaud-system",
    "PROVIDER_NAME": "pyrigaud",
    "TLS_ENABLED": "true",
    "LOG_LEVEL": "info",
    "LOG_FORMAT": "json",
}
# The pod's securityContext, and what this machine's sandbox needs: runc (the engine config)
# and rlimits no higher than the host's (podman would raise nofile and nproc).
RUN_FLAGS = [
    "--network=none",
    "--read-only",
    "--read-only-tmpfs=false",  # podman's default also mounts /run and /var/tmp writable
    "--tmpfs=/tmp",
    f"--user={UNPRIVILEGED}:{UNPRIVILEGED}",
    "--cap-drop=all",
    "--security-opt=no-new-privileges",
    "--ulimit=nofile=1024:1024",
    "--ulimit=nproc=4096:4096",
]
# File systems a mount may be writable on: memory and kernel ones, never the image's disk.
PSEUDO_FILESYSTEMS = {"tmpfs", "proc", "devpts", "mqueue", "sysfs", "cgroup", "cgroup2"}


def podman(*arguments: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *arguments],
        env={**os.environ, **ENGINE},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def image() -> str:
    built = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=1200, check=False
    )
    assert built.returncode == 0, built.stderr[-4000:]
    return built.stdout.strip().splitlines()[-1]


@pytest.fixture
def tls_secrets(tmp_path: Path) -> tuple[Path, Path]:
    """The pod's TLS Secret (readable by the pod's fsGroup, as kubelet mounts it with
    fsGroup 65532 and defaultMode 0440), and the manager's client certificate."""
    authority = Authority("pyrigaud-image-test-ca")
    pod_secret = tmp_path / "pod-tls"
    mount_secret(pod_secret, authority.secret(authority.server()))
    for directory, _subdirectories, files in os.walk(pod_secret):
        os.chown(directory, 0, UNPRIVILEGED)
        os.chmod(directory, 0o750)
        for name in files:
            os.chown(Path(directory, name), 0, UNPRIVILEGED)
            os.chmod(Path(directory, name), 0o440)
    manager = authority.manager()
    manager_tls = tmp_path / "manager-tls"
    manager_tls.mkdir()
    for name, content in (
        ("tls.crt", manager.cert_pem),
        ("tls.key", manager.key_pem),
        ("ca.crt", authority.pem),
    ):
        (manager_tls / name).write_bytes(content)
    return pod_secret, manager_tls


@pytest.fixture
def container(image: str, tls_secrets: tuple[Path, Path]) -> Iterator[str]:
    pod_secret, _manager_tls = tls_secrets
    name = f"pyrigaud-image-test-{secrets.token_hex(4)}"
    environment = [f"--env={key}={value}" for key, value in MANAGER_ENV.items()]
    started = podman(
        *("run", "--detach", f"--name={name}", *RUN_FLAGS, *environment),
        f"--volume={pod_secret}:{TLS_DIR}:ro",
        image,
        f"--port={GRPC_PORT}",
        f"--health-port={HEALTH_PORT}",
    )
    try:
        assert started.returncode == 0, started.stderr
        yield name
    finally:
        podman("rm", "--force", name)


def main_pid(name: str) -> int:
    inspected = podman("inspect", "--format={{.State.Pid}}", name)
    assert inspected.returncode == 0, inspected.stderr
    return int(inspected.stdout)


def status_field(pid: int, field: str) -> list[str]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return line.split()[1:]
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def mounts(pid: int) -> dict[str, tuple[set[str], str]]:
    """Mount point -> (mount options, file system type), as the process sees them."""
    table = {}
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields, _, tail = line.partition(" - ")
        words = fields.split()
        table[words[4]] = (set(words[5].split(",")), tail.split()[0])
    return table


def interfaces(pid: int) -> set[str]:
    lines = Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]  # after the two headers
    return {line.split(":")[0].strip() for line in lines}


def probe(pid: int, manager_tls: Path) -> dict[str, Any]:
    probed = subprocess.run(
        [
            *("nsenter", f"--net=/proc/{pid}/ns/net", "--", sys.executable, str(PROBE)),
            *(str(GRPC_PORT), str(HEALTH_PORT), str(manager_tls), "localhost"),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert probed.returncode == 0, probed.stderr
    seen: dict[str, Any] = json.loads(probed.stdout)
    return seen


def test_image_serves_the_manager_as_the_pod_runs_it_and_stops_on_sigterm(
    container: str, tls_secrets: tuple[Path, Path]
) -> None:
    pid = main_pid(container)
    seen = probe(pid, tls_secrets[1])
    assert seen["healthz"] == {"status": 200, "body": "ok"}
    assert seen["validate"]["ok"] is True, seen["validate"]
    assert "test" in seen["vms"]  # the test driver's own domain

    assert status_field(pid, "Uid") == [str(UNPRIVILEGED)] * 4
    assert status_field(pid, "CapEff") == ["0000000000000000"]
    assert status_field(pid, "NoNewPrivs") == ["1"]
    table = mounts(pid)
    assert "ro" in table["/"][0]
    assert "rw" in table["/tmp"][0]
    assert table["/tmp"][1] == "tmpfs"
    assert "ro" in table[TLS_DIR][0]
    writable = {point for point, (options, kind) in table.items() if "rw" in options}
    assert all(table[point][1] in PSEUDO_FILESYSTEMS for point in writable), table
    assert interfaces(pid) == {"lo"}

    # SIGTERM alone (podman kill sends no SIGKILL after it): exit status 0 and the last line
    # "pyrigaud stopped" say the server drained and stopped on it.
    assert podman("kill", "--signal=TERM", container).returncode == 0
    waited = podman("wait", container, timeout=60)
    assert waited.stdout.strip() == "0", waited.stderr
    logs = podman("logs", container)
    output = logs.stdout + logs.stderr
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    messages = [line["msg"] for line in lines]
    assert "pyrigaud serving" in messages
    assert messages[-1] == "pyrigaud stopped"
    assert not [line for line in lines if line["level"] in ("error", "critical")], lines
    for complaint in ("Read-only file system", "Permission denied", "Traceback"):
        assert complaint not in output
