"""`pyrigaud conformance` against pyrigaud itself on every backend (every required clause
passes), against a deliberately broken provider (it fails, naming the faults), read-only,
interrupted, over mutual TLS, and from the core install alone."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from pyrigaud.client.conformance.catalogue import CLAUSES, selected

from support.broken_provider import broken_provider
from support.image_server import qcow2_of, raw_image, serving
from support.kit import PYRIGAUD, kit, names_listed, served
from support.pki import Authority, mount_secret
from support.qemu import (
    QEMU_URI,
    TEST_POOL_PATH,
    ensure_dir_pool,
    open_qemu,
    remove_pool_leftovers,
)
from support.qemu_wanted import qemu_param

ALL_KEYS = [clause.key for clause in CLAUSES]


def clause_results(report_file: Path) -> dict[str, dict[str, str]]:
    report = json.loads(report_file.read_text())
    return {entry["clause"]: entry for entry in report["clauses"]}


# --- every backend --------------------------------------------------------------------------


# The fake prepares http(s) images without fetching them.
FAKE_IMAGE = [
    "--prepare-image-json",
    json.dumps({"source": {"http": {"url": "http://images/base.qcow2"}}}),
]


# What a backend's run is given: the serve environment and the kit's arguments.
Setup = tuple[dict[str, str], list[str]]
STAGING_PVC = "kit-staging"  # a PVC "mounted" under the served provider's migration root


def _staged(migration_root: Path) -> Setup:
    """A pvc:// staging URL whose PVC the served provider has mounted."""
    (migration_root / STAGING_PVC).mkdir(parents=True)
    return (
        {"PYRIGAUD_MIGRATION_STORAGE_ROOT": str(migration_root)},
        ["--staging-url", f"pvc://{STAGING_PVC}/conformance.qcow2", "--staging-backend", "pvc"],
    )


def _prepares(source: dict[str, object]) -> list[str]:
    return ["--prepare-image-json", json.dumps({"source": source})]


@contextmanager
def _fake(tmp_path: Path) -> Iterator[Setup]:
    staging_env, staging = _staged(tmp_path / "migration")
    yield {"PROVIDER_TYPE": "fake", **staging_env}, [*FAKE_IMAGE, *staging]


@contextmanager
def _libvirt_test_driver(tmp_path: Path) -> Iterator[Setup]:
    yield {}, []  # serve's default: libvirt on test:///default


@contextmanager
def _vsphere(tmp_path: Path) -> Iterator[Setup]:
    """The simulator's template for Create; a tiny OVA on loopback to prepare; pvc staging."""
    from support.ova import DATASTORE, ova_of, ovf_descriptor, tiny_disk  # noqa: PLC0415
    from support.vsphere import TEMPLATE_VM, shared_simulator  # noqa: PLC0415 - builds Go

    raw, vmdk = tiny_disk(tmp_path)
    staging_env, staging = _staged(tmp_path / "migration")
    with serving({"/tiny.ova": ova_of(ovf_descriptor(vmdk, len(raw)), vmdk)}) as images:
        env = shared_simulator().serve_environ(
            PYRIGAUD_IMAGE_URL_ALLOW_LOOPBACK="true",
            PROVIDER_DEFAULT_DATASTORE=DATASTORE,  # where ImagePrepare and ImportDisk land
            **staging_env,
        )
        image = json.dumps({"TemplateName": TEMPLATE_VM})
        yield (
            env,
            [
                *("--image-json", image),
                *_prepares({"vsphere": {"ovaURL": images.url("/tiny.ova")}}),
                *staging,
            ],
        )


KIT_POOL = "pyrigaud-kit"


@contextmanager
def _qemu(tmp_path: Path) -> Iterator[Setup]:
    """qemu:///system, the run's disks in a dir pool of the kit's own (the shared test pool is
    wiped by other QEMU tests' cleanup), emptied of any crashed run's leftovers first; a small
    qcow2 on loopback to prepare; pvc staging."""
    _empty_kit_pool()
    raw = raw_image(1024 * 1024)
    staging_env, staging = _staged(tmp_path / "migration")
    with serving({"/base.qcow2": qcow2_of(raw, tmp_path)}) as images:
        env = {
            "PROVIDER_ENDPOINT": QEMU_URI,
            "LIBVIRT_DOMAIN_TYPE": "qemu",
            "PYRIGAUD_IMAGE_URL_ALLOW_LOOPBACK": "true",
            **staging_env,
        }
        yield (
            env,
            [
                *("--placement-json", json.dumps({"Datastore": KIT_POOL})),
                *_prepares({"http": {"url": images.url("/base.qcow2")}}),
                *staging,
            ],
        )


def _empty_kit_pool() -> list[str]:
    """Every domain and volume of the kit's pool removed; their names."""
    path = TEST_POOL_PATH.parent / "kit"
    conn = open_qemu()
    try:
        ensure_dir_pool(conn, KIT_POOL, path)
        return remove_pool_leftovers(conn, KIT_POOL, path)
    finally:
        conn.close()


Backend = Callable[[Path], AbstractContextManager[Setup]]
BACKENDS: dict[str, Backend] = {
    "fake": _fake,
    "libvirt-test-driver": _libvirt_test_driver,
    "vsphere-simulator": _vsphere,
    "libvirt-qemu": _qemu,  # wanted with PYRIGAUD_TEST_QEMU=1, skipped otherwise (support.qemu)
}
# What each backend claims, so a skip is only ever an unclaimed feature; images and disk
# transfers run wherever they are claimed (the test driver has no image source or staging).
TRANSFERS = {"image-prepare", "disk-export-import"}
UNCLAIMED = {"unclaimed-import", "unclaimed-export"}
EXPECTED_SKIPS = {
    "fake": UNCLAIMED,
    # No volume streams: disk transfers unclaimed (and refused), images not loadable.
    "libvirt-test-driver": {*TRANSFERS, "hardware-upgrade"},
    "libvirt-qemu": {*UNCLAIMED, "hardware-upgrade"},
    "vsphere-simulator": UNCLAIMED,
}


def _params(backend: str, *rest: str) -> object:
    """A test's parameters on `backend`, marked when the backend needs the real daemon."""
    return qemu_param(backend, *rest) if backend == "libvirt-qemu" else pytest.param(backend, *rest)


@dataclass(frozen=True)
class KitRun:
    """One full `pyrigaud conformance` run against `pyrigaud serve` on one backend."""

    ran: subprocess.CompletedProcess[str]
    results: dict[str, dict[str, str]]
    junit: ET.Element
    prefix: str
    after: set[str]  # the VM names listed after the run (other suites share libvirtd)
    left: list[str]  # what the report says no RPC removes
    workdir: Path  # the run's own files (the staging PVC under migration/)


def _run_on(backend: str, tmp_path: Path) -> KitRun:
    prefix = f"kit-{backend}"
    with BACKENDS[backend](tmp_path) as (env, arguments), served(env, tmp_path) as server:
        ran = kit(
            *("conformance", server.endpoint, "--prefix", prefix),
            *("--json", str(tmp_path / "report.json"), "--junit", str(tmp_path / "report.xml")),
            *arguments,
        )
        after = names_listed(server.endpoint)
    assert (tmp_path / "report.json").exists(), ran.stderr
    results = clause_results(tmp_path / "report.json")
    junit = ET.parse(tmp_path / "report.xml").getroot()
    left = json.loads((tmp_path / "report.json").read_text())["left"]
    return KitRun(ran, results, junit, prefix, after, left, tmp_path)


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
    ("backend", "clause"), [_params(backend, key) for backend in BACKENDS for key in ALL_KEYS]
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
@pytest.mark.parametrize("backend", [_params(backend) for backend in BACKENDS])
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
    assert not any(name.startswith(run.prefix) for name in run.after)


@pytest.mark.slow
@pytest.mark.parametrize("backend", [_params("vsphere-simulator"), _params("libvirt-qemu")])
def test_images_and_transfers_ran_and_what_they_made_is_gone_or_named(
    backend: str, kit_runs: Callable[[str], KitRun]
) -> None:
    """Given an image to prepare and a staging store, the claimed ImagePrepare, ExportDisk and
    ImportDisk ran. The staged export is on the operator's store: named as left. vSphere lists
    the prepared template (Delete removes it) and the VM made from the imported disk takes the
    disk along; libvirt's volumes no RPC removes: the report names them, and they (with the
    import's record beside the imported disk) are exactly what the run left in its pool."""
    run = kit_runs(backend)
    for key in TRANSFERS:
        assert run.results[key]["result"] == "passed", run.results[key]["reason"]
    staged = f"staged export pvc://{STAGING_PVC}/conformance.qcow2"
    assert (run.workdir / "migration" / STAGING_PVC / "conformance.qcow2").is_file()
    if backend == "vsphere-simulator":
        assert run.left == [staged]
        return
    pool = TEST_POOL_PATH.parent / "kit"
    image, imported = f"{run.prefix}-image.qcow2", f"{run.prefix}-imported.qcow2"
    assert run.left == [
        f"prepared image {pool}/{image}",
        staged,
        f"imported disk {pool}/{imported}",
    ]
    assert f"left: imported disk {pool}/{imported} (no RPC removes it)" in run.ran.stdout
    record = f"{imported}.pyrigaud-import.json"
    assert sorted(_empty_kit_pool()) == [image, imported, record]


@pytest.mark.slow
def test_without_an_image_a_backend_with_no_blank_disks_is_told_what_to_pass(
    tmp_path: Path,
) -> None:
    with _vsphere(tmp_path) as (env, _arguments), served(env, tmp_path) as server:
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
    with _fake(tmp_path) as (env, arguments), served(env, tmp_path) as server:
        ran = kit(
            *("conformance", server.endpoint, "--prefix", "kit-transfers"),
            *arguments,
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
    assert failed == {
        "describe-missing",
        "snapshots",
        "uefi-snapshots",
        "delete",
        "no-unknown-internal",
    }
    assert "Describe answered UNKNOWN: vm lookup failed" in results["describe-missing"]["reason"]
    assert results["snapshots"]["reason"] == (
        "SnapshotCreate answered UNIMPLEMENTED: snapshots are not implemented "
        "(GetCapabilities claims supports_snapshots)"
    )
    assert "circuit breaker" in results["no-unknown-internal"]["reason"]
    assert results["memory-snapshot"]["result"] == "skipped"  # not claimed: not required
    assert results["create"]["result"] == "passed"
    suite = ET.parse(tmp_path / "r.xml").getroot()
    assert suite.get("failures") == "5"
    assert left == set()  # failing clauses did not keep the cleanup from removing the VMs


def test_a_reboot_that_stops_the_vm_and_a_disk_without_a_path_fail_their_clauses(
    tmp_path: Path,
) -> None:
    with broken_provider(reboot_and_disk_faults=True) as (endpoint, servicer):
        ran = kit(
            *("conformance", endpoint, "--prefix", "kit-broken-power"),
            *("--json", str(tmp_path / "r.json")),
        )
        left = {vm.name for vm in servicer.vms.values()}
    assert ran.returncode == 1
    results = clause_results(tmp_path / "r.json")
    assert results["reboot"]["result"] == "failed"
    assert results["reboot"]["reason"] == (
        "Power REBOOT answered done; Describe then says Off, not On"
    )
    assert results["disk-info"]["result"] == "failed"
    assert results["disk-info"]["reason"].startswith("GetDiskInfo(")
    assert results["disk-info"]["reason"].endswith(") answered a disk with an empty path")
    assert results["hardware-upgrade"]["result"] == "passed"
    assert left == set()


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


# A test run started in the background inherits SIGINT ignored, and so would the kit: this
# gives it SIGINT's default back (exec keeps it), as a terminal's foreground job has.
WITH_DEFAULT_SIGINT = [
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])",
]


def test_ctrl_c_mid_create_still_removes_every_vm_of_the_run(tmp_path: Path) -> None:
    with served({"PROVIDER_TYPE": "fake", "PYRIGAUD_FAKE_LATENCY": "create=3"}, tmp_path) as server:
        running = subprocess.Popen(
            [
                *WITH_DEFAULT_SIGINT,
                *PYRIGAUD,
                "conformance",
                server.endpoint,
                "--prefix",
                "kit-interrupted",
            ],
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
