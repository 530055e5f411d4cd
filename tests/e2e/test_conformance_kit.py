"""`pyrigaud conformance` against pyrigaud itself on every backend (every required clause
passes), against a deliberately broken provider (it fails, naming the faults), read-only,
interrupted, over mutual TLS, and from the core install alone."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pyrigaud.client.conformance.catalogue import CLAUSES, selected

from broken_provider import broken_provider
from kit_support import PYRIGAUD, kit, names_listed, served
from pki_support import Authority, mount_secret
from qemu_support import qemu_enabled

ALL_KEYS = [clause.key for clause in CLAUSES]


def clause_results(report_file: Path) -> dict[str, dict[str, str]]:
    report = json.loads(report_file.read_text())
    return {entry["clause"]: entry for entry in report["clauses"]}


# --- every backend --------------------------------------------------------------------------


# The fake prepares http(s) images without fetching them and stages pvc transfers in memory.
FAKE_IMAGE_AND_STAGING = [
    *(
        "--prepare-image-json",
        json.dumps({"source": {"http": {"url": "http://images/base.qcow2"}}}),
    ),
    *("--staging-url", "pvc://conformance/kit.qcow2", "--staging-backend", "pvc"),
]


def _fake(tmp_path: Path) -> tuple[dict[str, str], list[str]]:
    return {"PROVIDER_TYPE": "fake"}, FAKE_IMAGE_AND_STAGING


def _libvirt_test_driver(tmp_path: Path) -> tuple[dict[str, str], list[str]]:
    return {}, []  # serve's default: libvirt on test:///default


def _vsphere(tmp_path: Path) -> tuple[dict[str, str], list[str]]:
    from vsphere_support import TEMPLATE_VM, shared_simulator  # noqa: PLC0415 - builds Go

    image = json.dumps({"TemplateName": TEMPLATE_VM})
    return shared_simulator().serve_environ(), ["--image-json", image]


def _qemu(tmp_path: Path) -> tuple[dict[str, str], list[str]]:
    """qemu:///system, the run's disks in a dir pool of the kit's own (the shared test pool is
    wiped by other QEMU tests' cleanup), emptied of any crashed run's leftovers first."""
    from qemu_support import (  # noqa: PLC0415
        QEMU_URI,
        TEST_POOL_PATH,
        ensure_dir_pool,
        open_qemu,
        remove_pool_leftovers,
    )

    pool, path = "pyrigaud-kit", TEST_POOL_PATH.parent / "kit"
    conn = open_qemu()
    try:
        ensure_dir_pool(conn, pool, path)
        remove_pool_leftovers(conn, pool, path)
    finally:
        conn.close()
    env = {"PROVIDER_ENDPOINT": QEMU_URI, "LIBVIRT_DOMAIN_TYPE": "qemu"}
    return env, ["--placement-json", json.dumps({"Datastore": pool})]


Backend = Callable[[Path], tuple[dict[str, str], list[str]]]
BACKENDS: dict[str, Backend] = {
    "fake": _fake,
    "libvirt-test-driver": _libvirt_test_driver,
    "vsphere-simulator": _vsphere,
}
if qemu_enabled():  # opt-in, as every libvirt-on-QEMU test (PYRIGAUD_TEST_QEMU=1)
    BACKENDS["libvirt-qemu"] = _qemu
# What each backend claims, so a skip is only ever an unclaimed feature.
# Claimed images and transfers are checked only where the run passes an image and a staging
# store (the fake); elsewhere they are skipped, naming the flag, or unclaimed.
TRANSFERS = {"image-prepare", "disk-export-import"}
EXPECTED_SKIPS = {
    "fake": {"unclaimed-import", "unclaimed-export"},
    "libvirt-test-driver": {"unclaimed-import", "unclaimed-export", *TRANSFERS},
    "libvirt-qemu": {"unclaimed-import", "unclaimed-export", *TRANSFERS},
    "vsphere-simulator": TRANSFERS,
}


@dataclass(frozen=True)
class KitRun:
    """One full `pyrigaud conformance` run against `pyrigaud serve` on one backend."""

    ran: subprocess.CompletedProcess[str]
    results: dict[str, dict[str, str]]
    junit: ET.Element
    prefix: str
    before: set[str]  # the VM names listed before the run, and after it
    after: set[str]


def _run_on(backend: str, tmp_path: Path) -> KitRun:
    env, arguments = BACKENDS[backend](tmp_path)
    prefix = f"kit-{backend}"
    with served(env, tmp_path) as server:
        before = names_listed(server.endpoint)
        ran = kit(
            *("conformance", server.endpoint, "--prefix", prefix),
            *("--json", str(tmp_path / "report.json"), "--junit", str(tmp_path / "report.xml")),
            *arguments,
        )
        after = names_listed(server.endpoint)
    assert (tmp_path / "report.json").exists(), ran.stderr
    results = clause_results(tmp_path / "report.json")
    junit = ET.parse(tmp_path / "report.xml").getroot()
    return KitRun(ran, results, junit, prefix, before, after)


@pytest.fixture(scope="module")
def kit_runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], KitRun]:
    """Each backend's run, made once (on first use) for all of its clause tests."""
    runs: dict[str, KitRun] = {}

    def run(backend: str) -> KitRun:
        if backend not in runs:
            runs[backend] = _run_on(backend, tmp_path_factory.mktemp(backend))
        return runs[backend]

    return run


@pytest.mark.slow
@pytest.mark.parametrize(
    ("backend", "clause"), [(backend, key) for backend in BACKENDS for key in ALL_KEYS]
)
def test_the_clause_holds_on_pyrigaud(
    backend: str, clause: str, kit_runs: Callable[[str], KitRun]
) -> None:
    """The contract suite, clause by clause: the kit's catalogue on every backend."""
    entry = kit_runs(backend).results[clause]
    if clause in EXPECTED_SKIPS[backend]:  # a feature this backend does not claim
        assert entry["result"] == "skipped"
        assert entry["reason"]
    else:
        assert entry["result"] == "passed", entry["reason"]


@pytest.mark.slow
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_the_run_is_conformant_reported_and_leaves_no_vm(
    backend: str, kit_runs: Callable[[str], KitRun]
) -> None:
    run = kit_runs(backend)
    assert run.ran.returncode == 0, run.ran.stdout + run.ran.stderr
    assert list(run.results) == ALL_KEYS
    assert run.ran.stdout.splitlines()[-1] == "CONFORMANT"
    assert f"[{len(ALL_KEYS)}/{len(ALL_KEYS)}] no-unknown-internal: passed" in run.ran.stderr
    assert (run.junit.get("tests"), run.junit.get("failures")) == (str(len(ALL_KEYS)), "0")
    assert run.junit.get("skipped") == str(len(EXPECTED_SKIPS[backend]))
    assert run.after == run.before  # every VM of the run is gone
    assert not any(name.startswith(run.prefix) for name in run.after)


@pytest.mark.slow
def test_without_an_image_a_backend_with_no_blank_disks_is_told_what_to_pass(
    tmp_path: Path,
) -> None:
    env, _arguments = _vsphere(tmp_path)
    with served(env, tmp_path) as server:
        ran = kit("conformance", server.endpoint, "--json", str(tmp_path / "r.json"))
    assert ran.returncode == 1
    results = clause_results(tmp_path / "r.json")
    assert results["create"]["result"] == "failed"
    assert results["create"]["reason"].startswith("Create answered INVALID_ARGUMENT: ")
    assert results["create"]["reason"].endswith(
        "(a backend without blank disks needs --image-json)"
    )
    assert results["power-on"]["reason"] == (
        "needs the run's VM, and the create clause did not make one"
    )


def test_read_only_runs_only_clauses_that_change_nothing(tmp_path: Path) -> None:
    with served({"PROVIDER_TYPE": "fake"}, tmp_path) as server:
        created = kit(
            "vm",
            "create",
            "bystander",
            "--cpu",
            "1",
            "--memory",
            "256Mi",
            "--endpoint",
            server.endpoint,
        )
        assert created.returncode == 0, created.stderr
        ran = kit("conformance", server.endpoint, "--read-only", "--json", str(tmp_path / "r.json"))
        assert names_listed(server.endpoint) == {"bystander"}
    assert ran.returncode == 0, ran.stdout
    assert list(clause_results(tmp_path / "r.json")) == [
        clause.key for clause in selected(read_only_run=True)
    ]
    assert not any(clause.mutating for clause in selected(read_only_run=True))


def test_claimed_images_and_transfers_pass_with_the_flags_and_hide_the_credential(
    tmp_path: Path,
) -> None:
    secret = "kit-secret-value-0123"
    with served({"PROVIDER_TYPE": "fake"}, tmp_path) as server:
        ran = kit(
            *("conformance", server.endpoint, "--prefix", "kit-transfers"),
            *FAKE_IMAGE_AND_STAGING,
            *("--staging-credential", f"token={secret}", "--json", str(tmp_path / "r.json")),
        )
        left = names_listed(server.endpoint)
    results = clause_results(tmp_path / "r.json")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    for key in TRANSFERS:
        assert results[key]["result"] == "passed", results[key]["reason"]
    assert secret not in ran.stdout + ran.stderr + (tmp_path / "r.json").read_text()
    assert not any(name.startswith("kit-transfers") for name in left)


def test_claimed_images_and_transfers_without_the_flags_are_skipped_naming_them(
    tmp_path: Path,
) -> None:
    with served({"PROVIDER_TYPE": "fake"}, tmp_path) as server:
        ran = kit("conformance", server.endpoint, "--json", str(tmp_path / "r.json"))
    results = clause_results(tmp_path / "r.json")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert results["image-prepare"]["result"] == "skipped"
    assert results["image-prepare"]["reason"].endswith("pass --prepare-image-json")
    assert results["disk-export-import"]["result"] == "skipped"
    assert results["disk-export-import"]["reason"].endswith("pass --staging-url")


def test_a_staging_credential_without_a_key_is_a_usage_error_that_shows_no_value() -> None:
    ran = kit(
        *("conformance", "127.0.0.1:1", "--staging-url", "pvc://conformance/kit.qcow2"),
        *("--staging-credential", "kit-secret-value-0123"),
    )
    assert ran.returncode == 2
    assert ran.stderr == "pyrigaud conformance: --staging-credential must be KEY=VALUE\n"


# --- a broken provider ----------------------------------------------------------------------


def test_a_broken_provider_fails_with_a_report_naming_each_fault(tmp_path: Path) -> None:
    with broken_provider() as (endpoint, servicer):
        ran = kit(
            "conformance",
            endpoint,
            "--prefix",
            "kit-broken",
            "--json",
            str(tmp_path / "r.json"),
            "--junit",
            str(tmp_path / "r.xml"),
        )
        left = {vm.name for vm in servicer.vms.values()}
    assert ran.returncode == 1
    assert ran.stdout.splitlines()[-1] == "NOT CONFORMANT"
    results = clause_results(tmp_path / "r.json")
    failed = {key for key, entry in results.items() if entry["result"] == "failed"}
    assert failed == {"describe-missing", "snapshots", "delete", "no-unknown-internal"}
    assert "Describe answered UNKNOWN: vm lookup failed" in results["describe-missing"]["reason"]
    assert results["snapshots"]["reason"] == (
        "SnapshotCreate answered UNIMPLEMENTED: snapshots are not implemented "
        "(GetCapabilities claims supports_snapshots)"
    )
    assert "circuit breaker" in results["no-unknown-internal"]["reason"]
    assert results["memory-snapshot"]["result"] == "skipped"  # not claimed: not required
    assert results["create"]["result"] == "passed"
    suite = ET.parse(tmp_path / "r.xml").getroot()
    assert suite.get("failures") == "4"
    assert left == set()  # failing clauses did not keep the cleanup from removing the VMs


def test_an_import_whose_checksum_differs_from_the_export_fails_its_clause(
    tmp_path: Path,
) -> None:
    with broken_provider(claims_transfers=True) as (endpoint, servicer):
        ran = kit(
            *("conformance", endpoint, "--prefix", "kit-broken-transfer"),
            *("--staging-url", "pvc://conformance/kit.qcow2", "--json", str(tmp_path / "r.json")),
        )
        left = {vm.name for vm in servicer.vms.values()}
    assert ran.returncode == 1
    entry = clause_results(tmp_path / "r.json")["disk-export-import"]
    assert entry["result"] == "failed"
    assert entry["reason"] == (
        f"ImportDisk checksum {'b' * 64!r} differs from the export's {'a' * 64!r}"
    )
    assert left == set()


@pytest.mark.slow
def test_a_task_status_past_the_managers_deadline_fails_its_clause(tmp_path: Path) -> None:
    with broken_provider(task_status_delay=11) as (endpoint, _servicer):
        ran = kit("conformance", endpoint, "--read-only", "--json", str(tmp_path / "r.json"))
    assert ran.returncode == 1
    assert clause_results(tmp_path / "r.json")["task-unknown"] == {
        "clause": "task-unknown",
        "title": "TaskStatus of an unknown id: done with error",
        "result": "failed",
        "seconds": pytest.approx(10, abs=1.5),
        "reason": "TaskStatus did not answer within the manager's 10 s deadline",
    }


# --- interrupted ----------------------------------------------------------------------------


def test_ctrl_c_mid_create_still_removes_every_vm_of_the_run(tmp_path: Path) -> None:
    with served({"PROVIDER_TYPE": "fake", "PYRIGAUD_FAKE_LATENCY": "create=3"}, tmp_path) as server:
        running = subprocess.Popen(
            [*PYRIGAUD, "conformance", server.endpoint, "--prefix", "kit-interrupted"],
            env={"PATH": os.environ.get("PATH", "")},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert running.stderr is not None
        for line in running.stderr:  # the clause before create has finished
            if "unclaimed-import" in line:
                break
        os.kill(running.pid, signal.SIGINT)  # Create (3 s) is in flight
        out, _ = running.communicate(timeout=60)
        assert names_listed(server.endpoint) == set()
    assert running.returncode == 130
    assert "interrupted: the run's VMs were removed" in out
    assert re.search(r"^create +not run", out, re.MULTILINE), out


# --- mutual TLS -----------------------------------------------------------------------------


@pytest.fixture
def mtls_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    ca = Authority("kit-ca")
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
    with served(env, tmp_path) as running:
        yield running.endpoint, client_dir


def test_conformance_over_mutual_tls(mtls_server: tuple[str, Path]) -> None:
    endpoint, client_dir = mtls_server
    ran = kit("conformance", endpoint, "--tls-dir", str(client_dir), "--server-name", "localhost")
    assert ran.returncode == 0, ran.stdout
    plaintext = kit("conformance", endpoint, "--read-only")
    assert plaintext.returncode == 1
    assert "UNAVAILABLE" in plaintext.stdout


# --- the core install alone -----------------------------------------------------------------


SERVER_CODE = (
    "pyrigaud.domain",
    "pyrigaud.application",
    "pyrigaud.adapters",
    "pyrigaud.entrypoints.container",
    "pyrigaud.entrypoints.grpc.servicer",
    "pydantic",
    "dependency_injector",
)


def test_the_kit_runs_without_backend_extras_or_server_code(tmp_path: Path) -> None:
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    for module in ("libvirt", "pyVmomi", "boto3", "kubernetes"):
        (hidden / f"{module}.py").write_text(f"raise ImportError('No module named {module}')\n")
    with broken_provider() as (endpoint, _servicer):
        probe = (
            "import sys; from pyrigaud.client.kit import main; "
            f"code = main(['conformance', {endpoint!r}, '--read-only']); "
            f"print('loaded', sorted(m for m in sys.modules if m.startswith({SERVER_CODE!r})))"
        )
        alone = subprocess.run(
            [PYRIGAUD[0], "-c", probe],
            env={"PYTHONPATH": str(hidden)},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        through_pyrigaud = kit(
            "conformance", endpoint, "--read-only", env={"PYTHONPATH": str(hidden)}
        )
    assert re.search(r"^validate +passed", alone.stdout, re.MULTILINE), alone.stderr
    assert alone.stdout.splitlines()[-1] == "loaded []"
    assert re.search(r"^validate +passed", through_pyrigaud.stdout, re.MULTILINE)
