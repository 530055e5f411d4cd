"""`pyrigaud serve` as a process: probes, health service, reflection, refusal, SIGTERM drain."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2_grpc as pb_grpc

from support import wait_until
from support.e2e import CLASS_JSON
from support.ports import free_port

PYRIGAUD = [sys.executable, "-m", "pyrigaud.entrypoints.cli"]
# A Create lasts this long on the served fake: time for a test to see the server draining it.
CREATE_LATENCY = 5
LIVENESS_SECONDS = 20  # bounds of the waits for a state, never speed claims


@dataclass
class Process:
    popen: subprocess.Popen[str]
    port: int
    health_port: int

    def get(self, path: str) -> tuple[int, str]:
        url = f"http://127.0.0.1:{self.health_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def channel(self) -> grpc.Channel:
        return grpc.insecure_channel(f"127.0.0.1:{self.port}")


def start(extra_env: dict[str, str], tmp_path: Path) -> Process:
    port, health_port = free_port(), free_port()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "VIRTRIGAUD_PROVIDER_INSECURE": "true",
        "PYRIGAUD_TLS_DIR": str(tmp_path / "no-tls"),
        "LOG_FORMAT": "json",
        "LOG_LEVEL": "debug",
        **extra_env,
    }
    popen = subprocess.Popen(
        [
            *PYRIGAUD,
            "serve",
            f"--port={port}",
            f"--health-port={health_port}",
            "--listen-address",
            "127.0.0.1",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    process = Process(popen, port, health_port)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            raise AssertionError(f"pyrigaud exited early: {popen.communicate()}")
        try:
            if process.get("/readyz")[0] == 200:
                return process
        except OSError:
            time.sleep(0.1)
    popen.kill()
    raise AssertionError("pyrigaud did not become ready in 20 s")


def run_to_exit(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run `pyrigaud serve` expecting it to refuse to start (bounded by a timeout)."""
    return subprocess.run(
        [
            *PYRIGAUD,
            "serve",
            f"--port={free_port()}",
            f"--health-port={free_port()}",
            "--listen-address",
            "127.0.0.1",
        ],
        env={
            "PATH": os.environ.get("PATH", ""),
            "PYRIGAUD_TLS_DIR": str(tmp_path / "none"),
            "VIRTRIGAUD_PROVIDER_INSECURE": "true",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Process]:
    process = start(
        {"PROVIDER_TYPE": "fake", "PYRIGAUD_FAKE_LATENCY": f"create={CREATE_LATENCY}"}, tmp_path
    )
    yield process
    if process.popen.poll() is None:
        process.popen.kill()
        process.popen.communicate()


def test_http_probes_answer_as_kubelet_expects(served: Process) -> None:
    assert served.get("/healthz") == (200, "ok")
    assert served.get("/readyz") == (200, "ready")
    status, body = served.get("/health")
    assert status == 200
    assert json.loads(body)["provider_type"] == "fake"
    assert served.get("/nope")[0] == 404


def test_metrics_count_rpcs_and_hypervisor_calls(served: Process) -> None:
    with served.channel() as channel:
        pb_grpc.ProviderStub(channel).Describe(pb.DescribeRequest(id="missing"), timeout=5)
    status, body = served.get("/metrics")
    assert status == 200
    assert 'pyrigaud_rpc_requests_total{code="OK",method="Describe"} 1.0' in body
    assert 'pyrigaud_hypervisor_calls_total{operation="describe",outcome="ok"} 1.0' in body


def test_grpc_health_and_reflection(served: Process) -> None:
    with served.channel() as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "provider"):
            # types-grpcio-health-checking declares no methods on HealthStub.
            check = health.Check  # type: ignore[attr-defined]
            answer = check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        # types-grpcio-reflection types the stub loosely.
        replies = reflection.ServerReflectionInfo(  # type: ignore[operator]
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
        )
        services = {
            service.name for reply in replies for service in reply.list_services_response.service
        }
        assert "provider.v1.Provider" in services
        assert "grpc.health.v1.Health" in services


def test_sigterm_drains_in_flight_rpcs_then_exits_zero(served: Process) -> None:
    with served.channel() as channel:
        stub = pb_grpc.ProviderStub(channel)
        in_flight = stub.Create.future(
            pb.CreateRequest(name="drained", class_json=CLASS_JSON), timeout=30
        )
        wait_until(
            lambda: "pyrigaud_inflight_mutations 1.0" in served.get("/metrics")[1],
            LIVENESS_SECONDS,
            "the Create in flight",
        )
        served.popen.send_signal(signal.SIGTERM)
        # Not ready while draining: the Create (CREATE_LATENCY long) is still in flight.
        wait_until(lambda: served.get("/readyz")[0] == 503, LIVENESS_SECONDS, "/readyz 503")
        assert in_flight.result().id
    _, stderr = served.popen.communicate(timeout=20)
    assert served.popen.returncode == 0
    lines = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    assert any(line["msg"].startswith("received SIGTERM") for line in lines)
    rpc_lines = [line for line in lines if line.get("rpc_method") == "Create"]
    assert rpc_lines
    assert rpc_lines[0]["grpc_code"] == "OK"
    assert rpc_lines[0]["level"] == "info"


def test_every_log_line_is_json_and_names_no_secret(tmp_path: Path) -> None:
    process = start({"PYRIGAUD_FAKE_LATENCY": ""}, tmp_path)
    try:
        with process.channel() as channel:
            stub = pb_grpc.ProviderStub(channel)
            stub.Describe(pb.DescribeRequest(id="x"), timeout=5)
            export = pb.ExportDiskRequest(
                vm_id="x",
                destination_url="s3://bucket/key",
                backend_type="s3",
                transfer_mode="relay",
                credentials={"secretAccessKey": "hunter2"},
            )
            with pytest.raises(grpc.RpcError):
                stub.ExportDisk(export, timeout=5)
    finally:
        process.popen.send_signal(signal.SIGTERM)
        _, stderr = process.popen.communicate(timeout=20)
    lines = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    assert {line["level"] for line in lines} >= {"info", "debug"}
    assert any(line.get("rpc_method") == "Describe" and line["level"] == "debug" for line in lines)
    assert "hunter2" not in stderr


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"VIRTRIGAUD_PROVIDER_INSECURE": "false"}, "VIRTRIGAUD_PROVIDER_INSECURE"),
        ({"TLS_ENABLED": "true"}, "tls"),
        ({"PROVIDER_TYPE": "nonsense"}, "PROVIDER_TYPE"),
    ],
)
def test_refuses_to_start_without_tls_or_with_bad_settings(
    tmp_path: Path, env: dict[str, str], needle: str
) -> None:
    completed = run_to_exit(tmp_path, env)
    assert completed.returncode != 0
    assert needle.lower() in completed.stderr.lower()


def test_the_manager_style_arguments_start_serve(tmp_path: Path) -> None:
    """The manager runs the image with only --port=... --health-port=..."""
    port, health_port = free_port(), free_port()
    popen = subprocess.Popen(
        [*PYRIGAUD, f"--port={port}", f"--health-port={health_port}", "--listen-address=127.0.0.1"],
        env={
            "PATH": os.environ.get("PATH", ""),
            "VIRTRIGAUD_PROVIDER_INSECURE": "true",
            "PYRIGAUD_TLS_DIR": str(tmp_path / "none"),
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=20)
            assert pb_grpc.ProviderStub(channel).Validate(pb.ValidateRequest(), timeout=5).ok
    finally:
        popen.send_signal(signal.SIGTERM)
        popen.communicate(timeout=20)
    assert popen.returncode == 0


def test_by_default_serve_runs_the_libvirt_backend_on_libvirts_test_driver(
    tmp_path: Path,
) -> None:
    process = start({}, tmp_path)
    try:
        status, body = process.get("/health")
        assert (status, json.loads(body)["provider_type"]) == (200, "libvirt")
        with process.channel() as channel:
            stub = pb_grpc.ProviderStub(channel)
            validated = stub.Validate(pb.ValidateRequest(), timeout=10)
            assert validated.ok
            assert "test:///default" in validated.message
            vm_id = stub.Create(
                pb.CreateRequest(name="e2e-libvirt", class_json=CLASS_JSON), timeout=30
            ).id
            described = stub.Describe(pb.DescribeRequest(id=vm_id), timeout=10)
            assert (described.exists, described.power_state) == (True, "Off")
            assert vm_id in {vm.id for vm in stub.ListVMs(pb.ListVMsRequest(), timeout=10).vms}
            stub.Delete(pb.DeleteRequest(id=vm_id), timeout=30)
            assert not stub.Describe(pb.DescribeRequest(id=vm_id), timeout=10).exists
    finally:
        process.popen.send_signal(signal.SIGTERM)
        process.popen.communicate(timeout=20)
    assert process.popen.returncode == 0


def test_without_the_libvirt_extra_serve_names_the_extra(tmp_path: Path) -> None:
    hidden = tmp_path / "no-libvirt"
    hidden.mkdir()
    (hidden / "libvirt.py").write_text("raise ImportError('No module named libvirt')\n")
    completed = run_to_exit(tmp_path, {"PYTHONPATH": str(hidden)})  # libvirt: the default
    assert completed.returncode != 0
    assert "pyrigaud[libvirt]" in completed.stderr
    assert "PROVIDER_TYPE=fake" in completed.stderr


def test_the_vsphere_backend_serves_through_grpc(tmp_path: Path) -> None:
    from pyrigaud.adapters.hypervisors.vsphere.vcenter import INSTANCE_UUID  # noqa: PLC0415

    from support.vsphere import TEMPLATE_VM, running_simulator  # noqa: PLC0415 - builds Go

    with running_simulator() as simulator:
        process = start(simulator.serve_environ(), tmp_path)
        try:
            with process.channel() as channel:
                stub = pb_grpc.ProviderStub(channel)
                assert stub.Validate(pb.ValidateRequest(), timeout=20).ok
                image = json.dumps({"TemplateName": TEMPLATE_VM})
                request = pb.CreateRequest(
                    name="e2e-vsphere", class_json=CLASS_JSON, image_json=image
                )
                created = stub.Create(request, timeout=60)
                vm_id = created.id  # the instanceUuid chosen for the clone; its task makes the VM
                assert INSTANCE_UUID.fullmatch(vm_id)
                assert created.task.id == f"vsphere-task:{created.task.id.split(':')[1]}:{vm_id}"
                status = stub.TaskStatus(pb.TaskStatusRequest(task=created.task), timeout=10)
                assert (status.done, status.error) == (True, "")
                described = stub.Describe(pb.DescribeRequest(id=vm_id), timeout=20)
                assert (described.exists, described.power_state) == (True, "Off")
                desired = json.dumps({"Class": {"CPU": 3}})
                snapshot = stub.SnapshotCreate(
                    pb.SnapshotCreateRequest(vm_id=vm_id, name_hint="before"), timeout=60
                ).snapshot_id
                tasks = [
                    stub.Reconfigure(
                        pb.ReconfigureRequest(id=vm_id, desired_json=desired), timeout=60
                    ).task,
                    stub.HardwareUpgrade(pb.HardwareUpgradeRequest(id=vm_id), timeout=60).task,
                    stub.Power(pb.PowerRequest(id=vm_id, op=pb.POWER_OP_ON), timeout=60).task,
                ]
                described = stub.Describe(pb.DescribeRequest(id=vm_id), timeout=20)
                assert described.power_state == "On"
                assert json.loads(described.provider_raw_json)["numCPU"] == "3"
                revert = pb.SnapshotRevertRequest(vm_id=vm_id, snapshot_id=snapshot)
                removal = pb.SnapshotDeleteRequest(vm_id=vm_id, snapshot_id=snapshot)
                tasks += [
                    stub.SnapshotRevert(revert, timeout=60).task,
                    stub.SnapshotDelete(removal, timeout=60).task,
                ]
                for task in tasks:  # the simulator ends every Task within its call
                    assert task.id.startswith("vsphere-task:")
                    status = stub.TaskStatus(pb.TaskStatusRequest(task=task), timeout=10)
                    assert (status.done, status.error) == (True, "")
                described = stub.Describe(pb.DescribeRequest(id=vm_id), timeout=20)
                assert json.loads(described.provider_raw_json)["numCPU"] == "2"  # the snapshot's
                stub.Delete(pb.DeleteRequest(id=vm_id), timeout=60)
                assert not stub.Describe(pb.DescribeRequest(id=vm_id), timeout=20).exists
        finally:
            process.popen.send_signal(signal.SIGTERM)
            _, stderr = process.popen.communicate(timeout=20)
        assert process.popen.returncode == 0
        assert simulator.password not in stderr
