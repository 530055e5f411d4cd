"""The client CLI end to end against a running `pyrigaud serve` (fake backend): every command,
the JSON the manager would send, table and JSON output, exit codes by error class, mTLS."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.kit import kit, served
from support.pki import Authority, mount_secret
from support.ports import free_port


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("serve")
    (workdir / "migration" / "mig").mkdir(parents=True)  # PVC `mig`, mounted for disk moves
    environ = {
        "PROVIDER_TYPE": "fake",
        "PYRIGAUD_MIGRATION_STORAGE_ROOT": str(workdir / "migration"),
    }
    with served(environ, workdir) as server:
        yield server.endpoint


def cli(endpoint: str, *arguments: str) -> dict[str, object] | list[dict[str, object]]:
    """A command that must succeed, in JSON; the endpoint comes from PYRIGAUD_ENDPOINT."""
    ran = kit(*arguments, "--output", "json", env={"PYRIGAUD_ENDPOINT": endpoint})
    assert ran.returncode == 0, ran.stderr
    parsed: dict[str, object] | list[dict[str, object]] = json.loads(ran.stdout)
    return parsed


def listed(endpoint: str, name: str) -> dict[str, object]:
    rows = cli(endpoint, "vm", "list")
    assert isinstance(rows, list)
    return next(row for row in rows if row["name"] == name)


def test_a_vm_through_its_life(endpoint: str, tmp_path: Path) -> None:
    user_data = tmp_path / "user-data"
    user_data.write_text("#cloud-config\nhostname: life\n")
    created = cli(
        endpoint,
        *("vm", "create", "life", "--cpu", "2", "--memory", "1Gi", "--disk-size", "10Gi"),
        *("--network", "lan", "--disk", "5Gi", "--user-data", str(user_data), "--wait"),
    )
    assert isinstance(created, dict)
    vm_id = str(created["id"])
    row = listed(endpoint, "life")
    assert (row["id"], row["cpu"], row["memory_mib"], row["power_state"]) == (
        vm_id,
        2,
        "1024",
        "Off",  # protobuf's JSON writes int64 as a string
    )
    cli(endpoint, "vm", "power", vm_id, "on", "--wait")
    assert cli(endpoint, "vm", "describe", vm_id)["power_state"] == "On"  # type: ignore[call-overload]
    cli(endpoint, "vm", "reconfigure", vm_id, "--cpu", "4", "--memory", "2Gi", "--wait")
    assert (listed(endpoint, "life")["cpu"], listed(endpoint, "life")["memory_mib"]) == (4, "2048")
    snapshot = cli(endpoint, "snapshot", "create", vm_id, "--name", "before", "--wait")
    snapshot_id = str(snapshot["snapshot_id"])  # type: ignore[call-overload]
    cli(endpoint, "snapshot", "revert", vm_id, snapshot_id, "--wait")
    cli(endpoint, "snapshot", "delete", vm_id, snapshot_id, "--wait")
    clone = cli(
        endpoint,
        "clone",
        vm_id,
        "life-copy",
        "--cpu",
        "1",
        "--memory",
        "512Mi",
        "--hostname",
        "copy",
        "--wait",
    )
    assert listed(endpoint, "life-copy")["cpu"] == 1
    exported = cli(endpoint, "disk", "export", vm_id, "--destination", "pvc://mig/life.qcow2")
    assert str(exported["export_id"]).startswith("export-")  # type: ignore[call-overload]
    imported = cli(
        endpoint, "disk", "import", "--source", "pvc://mig/life.qcow2", "--target-name", "life-d"
    )
    assert imported["disk_id"] == "life-d"  # type: ignore[call-overload]
    disk = cli(endpoint, "disk", "info", vm_id)
    assert disk["virtual_size_bytes"]  # type: ignore[call-overload]
    shutdown = cli(endpoint, "vm", "power", vm_id, "shutdown", "--graceful-timeout", "5", "--wait")
    assert "task_status" not in shutdown  # the fake's guest stops at once: no task to wait on
    assert cli(endpoint, "vm", "describe", vm_id)["power_state"] == "Off"  # type: ignore[call-overload]
    for target in (vm_id, str(clone["target_vm_id"])):  # type: ignore[call-overload]
        cli(endpoint, "vm", "delete", target, "--wait")
    assert not cli(endpoint, "vm", "describe", vm_id)["exists"]  # type: ignore[call-overload]


def test_caps_image_prepare_and_table_output(endpoint: str) -> None:
    caps = kit("caps", "--endpoint", endpoint)
    assert caps.returncode == 0
    assert "supports_snapshots" in caps.stdout
    assert "True" in next(line for line in caps.stdout.splitlines() if "supports_snapshots" in line)
    prepared = cli(
        endpoint,
        "image",
        "prepare",
        "base",
        "--url",
        "https://images.example.test/base.qcow2",
        "--wait",
    )
    assert prepared["prepared_image_id"]  # type: ignore[call-overload]
    kit("vm", "create", "tabled", "--memory", "256Mi", "--cpu", "1", "--endpoint", endpoint)
    table = kit("vm", "list", "--endpoint", endpoint).stdout.splitlines()
    assert table[0].split() == ["ID", "NAME", "POWER_STATE", "CPU", "MEMORY_MIB", "IPS"]
    assert any(line.split()[1:5] == ["tabled", "Off", "1", "256"] for line in table[1:])


def test_errors_print_the_code_and_exit_by_class(endpoint: str) -> None:
    missing = kit("vm", "power", "no-such-vm", "on", "--endpoint", endpoint)
    assert (missing.returncode, missing.stderr.split(":")[:2]) == (3, ["error", " NOT_FOUND"])
    invalid = kit("vm", "create", "", "--endpoint", endpoint)
    assert invalid.returncode == 4
    assert invalid.stderr.startswith("error: INVALID_ARGUMENT: ")
    unavailable = kit("caps", "--endpoint", f"127.0.0.1:{free_port()}")
    assert unavailable.returncode == 5
    assert unavailable.stderr.startswith("error: UNAVAILABLE")
    other = kit("snapshot", "revert", "x", "y", "--endpoint", "127.0.0.1:1", "--output", "json")
    assert other.returncode == 5
    failed_task = kit("task", "wait", "no-such-task", "--endpoint", endpoint)
    assert failed_task.returncode == 6
    assert "no-such-task" in failed_task.stderr
    bad_size = kit("vm", "create", "x", "--memory", "2 gigs", "--endpoint", endpoint)
    assert (bad_size.returncode, bad_size.stderr) == (
        2,
        "error: '2 gigs' is not a size such as 512Mi or 2Gi\n",
    )
    no_endpoint = kit("vm", "list")
    assert no_endpoint.returncode == 2
    assert "PYRIGAUD_ENDPOINT" in no_endpoint.stderr


def test_the_cli_over_mutual_tls(tmp_path: Path) -> None:
    ca = Authority("cli-ca")
    mount_secret(tmp_path / "server-tls", ca.secret(ca.server()))
    client_dir = tmp_path / "client-tls"
    client_dir.mkdir()
    manager = ca.manager()
    (client_dir / "tls.crt").write_bytes(manager.cert_pem)
    (client_dir / "tls.key").write_bytes(manager.key_pem)
    (client_dir / "ca.crt").write_bytes(ca.pem)
    env = {
        "PROVIDER_TYPE": "fake",
        "TLS_ENABLED": "true",
        "VIRTRIGAUD_PROVIDER_INSECURE": "false",
        "PYRIGAUD_TLS_DIR": str(tmp_path / "server-tls"),
    }
    tls = ("--tls-dir", str(client_dir), "--server-name", "localhost")
    with served(env, tmp_path) as server:
        created = kit(
            "vm",
            "create",
            "secure",
            "--cpu",
            "1",
            "--memory",
            "256Mi",
            "--endpoint",
            server.endpoint,
            *tls,
            "--output",
            "json",
        )
        assert created.returncode == 0, created.stderr
        vm_id = json.loads(created.stdout)["id"]
        described = kit("vm", "describe", vm_id, "--endpoint", server.endpoint, *tls)
        assert described.returncode == 0
        assert "exists" in described.stdout
        plaintext = kit("vm", "list", "--endpoint", server.endpoint)
        assert plaintext.returncode == 5  # the handshake refuses a client without a cert
        missing_files = kit("caps", "--endpoint", server.endpoint, "--tls-dir", str(tmp_path))
        assert missing_files.returncode == 2
        assert "tls.crt" in missing_files.stderr


@pytest.mark.slow
def test_wait_follows_a_real_task_to_its_end(tmp_path: Path) -> None:
    """On vSphere, Create answers with a vSphere task; --wait polls it until done."""
    from support.vsphere import TEMPLATE_VM, shared_simulator  # noqa: PLC0415 - builds Go

    with served(shared_simulator().serve_environ(), tmp_path) as server:
        created = cli(
            server.endpoint,
            *("vm", "create", "cli-waited", "--template", TEMPLATE_VM, "--cpu", "1"),
            *("--memory", "256Mi", "--wait"),
        )
        assert isinstance(created, dict)
        assert str(created["task"]["id"]).startswith("vsphere-task:")  # type: ignore[index]
        assert created["task_status"] == {"done": True, "error": ""}
        assert listed(server.endpoint, "cli-waited")["memory_mib"] == "256"
        cli(server.endpoint, "vm", "delete", str(created["id"]), "--wait")
        assert not cli(server.endpoint, "vm", "describe", str(created["id"]))["exists"]  # type: ignore[call-overload]
