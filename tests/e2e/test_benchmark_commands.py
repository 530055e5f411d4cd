"""The commands docs/benchmarks.md shows, run at a tiny size: a benchmark whose documented
command no longer runs fails here, not in a reader's hands. Each run checks the exit status and
the table it prints, never a figure (durations belong to the benchmarks themselves)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import pyrigaud

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
# Enough calls to fill each table row once; the documented sizes take minutes.
TINY_DESCRIBE = ["--vms", "2", "--warmup", "0", "--calls-c1", "5", "--calls-c32", "32"]
TINY_LIBVIRT = ["--sizes", "10", "--describe-calls", "5", "--validate-calls", "5"]
TINY_LIBVIRT += ["--virsh-calls", "1", "--virsh-budget", "1", "--list-sample", "1"]
TINY_VSPHERE = ["--sizes", "20", "--list-repeats", "2", "--describe-calls", "6"]
TINY_VSPHERE += ["--naive-sample", "3", "--naive-describe-calls", "2", "--page-size", "10"]
# 16 MiB disks (a quarter of the mostly-empty disk's written head), powered off, no warm-up,
# vSphere to libvirt: every store, each floor once after and once before its transfer. Both
# directions take twice as long, past what the test command can spare: the libvirt-to-vSphere
# floors (libvirt's download, the NFC import lease) run only in the full benchmark.
TINY_MIGRATION = ["--gib", "0.015625", "--s3-gib", "0.015625", "--warm-up-mib", "0"]
TINY_MIGRATION += ["--disks", "mostly-empty", "--states", "off", "--rounds", "2"]
TINY_MIGRATION += ["--sources", "vsphere"]
MIGRATION_TABLE = "| migration | op | pyrigaud | (a) libvirt stream | (b) SHA-256 | (c) store "
MIGRATION_RANGES = "| migration | op | rounds | pyrigaud s | ratio to the slowest floor "
needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: libvirtd's pools, the NFS server and staging"
)


def bench(script: str, *arguments: str, json_to: Path, timeout: float = 300) -> str:
    """The script's standard output, once it exited 0 having written its figures as JSON to
    `json_to` (the `--json` every benchmark takes)."""
    ran = subprocess.run(
        [sys.executable, str(BENCH / script), *arguments, "--json", str(json_to)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-4000:]
    assert json.loads(json_to.read_text())
    return ran.stdout


def test_the_describe_benchmark_runs_and_prints_its_table(tmp_path: Path) -> None:
    """The comparison, two rounds (each order of floor and pyrigaud once), with the client on
    CPUs of its own (`--split-cpus` only pins the processes: one run covers both commands)."""
    arguments = [*TINY_DESCRIBE, "--rounds", "2", "--split-cpus"]
    out = bench("describe_bench.py", *arguments, json_to=tmp_path / "out.json")
    assert "client on CPUs " in out
    assert "| target | phase | concurrency | calls | errors |" in out
    assert "pyrigaud/floor p50 at c=1: " in out
    assert "pyrigaud/floor rps at c=32: " in out
    assert "pyrigaud errors at c=32: 0" in out


def test_the_describe_benchmark_runs_on_libvirts_test_driver(tmp_path: Path) -> None:
    """pyrigaud on libvirt's test driver (in its own process), the VMs made by Create."""
    arguments = [*TINY_DESCRIBE, "--rounds", "1", "--backend", "libvirt"]
    out = bench("describe_bench.py", *arguments, json_to=tmp_path / "out.json")
    assert "backend libvirt" in out
    assert "pyrigaud/floor rps at c=32: " in out
    assert "pyrigaud errors at c=32: 0" in out


def test_the_describe_benchmark_counts_instructions_under_callgrind(tmp_path: Path) -> None:
    """Both servers under valgrind's callgrind (scripts/test installs it): about half a minute
    at this size, where the documented one takes minutes."""
    arguments = [*TINY_DESCRIBE, "--rounds", "1", "--instructions"]
    out = bench("describe_bench.py", *arguments, json_to=tmp_path / "out.json")
    assert "floor: 32 calls, " in out
    assert "pyrigaud: 32 calls, " in out
    assert "floor/pyrigaud instructions per Describe at c=32: " in out


def test_the_describe_benchmark_runs_during_a_create_flood(tmp_path: Path) -> None:
    flood = ["--create-flood", "--flood-threads", "2", "--create-latency", "0.05"]
    out = bench("describe_bench.py", *TINY_DESCRIBE, *flood, json_to=tmp_path / "out.json")
    assert "| pyrigaud | create flood | 32 |" in out
    assert "Create flood: 2 threads" in out


@pytest.mark.qemu  # the host inside libvirtd: the daemon's test driver
def test_the_libvirt_benchmark_runs_and_marks_what_it_extrapolates(tmp_path: Path) -> None:
    profiled = [*TINY_LIBVIRT, "--profile", "--profile-top", "3"]
    out = bench("libvirt_bench.py", *profiled, json_to=tmp_path / "out.json")
    assert "| domains | operation | pyrigaud calls | pyrigaud p50 ms |" in out
    for operation in ("Describe", "Validate"):
        assert f"| 10 | {operation} | 5 |" in out
    listing = next(line for line in out.splitlines() if line.startswith("| 10 | ListVMs |"))
    assert "(extrapolated)" in listing
    assert "Server RSS with 10 domains" in out


def test_the_vsphere_benchmark_runs_and_marks_what_it_extrapolates(tmp_path: Path) -> None:
    out = bench("vsphere_bench.py", *TINY_VSPHERE, json_to=tmp_path / "out.json")
    assert "| VMs | operation | way | calls | p50 ms |" in out
    for way in ("floor", "naive (extrapolated)", "adapter", "gRPC"):
        assert f"| 20 | ListVMs | {way} |" in out
    for way in ("floor", "naive", "adapter", "gRPC", "fake gRPC"):
        assert f"| 20 | Describe | {way} |" in out
    assert "vCenter calls per Describe after warm-up: server 0" in out


@needs_root
@pytest.mark.qemu
def test_the_image_benchmark_runs_and_prints_its_table(tmp_path: Path) -> None:
    out = bench("image_bench.py", "--gib", "0.015625", json_to=tmp_path / "out.json")
    assert "| hypervisor | operation | pyrigaud | qemu-img convert | ratio |" in out
    for hypervisor, operation in (
        ("libvirt", "import qcow2"),
        ("libvirt", "import vmdk"),
        ("libvirt", "export qcow2 at a snapshot"),
        ("vsphere", "import qcow2"),
        ("vsphere", "import vmdk"),
        ("vsphere", "export qcow2"),
    ):
        assert f"| {hypervisor} | {operation} | 1 |" in out  # its range, over one round


@needs_root
@pytest.mark.qemu
@pytest.mark.timeout(300)
def test_the_migration_benchmark_runs_every_store_with_the_floors_first_in_turn(
    tmp_path: Path,
) -> None:
    code = tmp_path / "code"  # --code: the providers run this package (here the installed one)
    code.mkdir()
    (code / "pyrigaud").symlink_to(Path(pyrigaud.__file__).parent)
    arguments = [*TINY_MIGRATION, "--code", str(code)]
    out = bench("migration_bench.py", *arguments, json_to=tmp_path / "out.json", timeout=600)
    assert MIGRATION_TABLE in out
    assert MIGRATION_RANGES in out
    for store in ("nfs", "pvc", "s3"):
        case = f"| v2l-{store}-mostly-empty-off |"
        assert f"{case} export (vsphere) |" in out
        assert f"{case} import (libvirt) |" in out
    table = out.split("All rows:")[1].split("Ranges over")[0]
    firsts = {line.split("|")[-3].strip() for line in table.splitlines() if "-off |" in line}
    assert firsts == {"pyrigaud", "floors"}


@needs_root
@pytest.mark.qemu
def test_the_migration_benchmark_profiles_each_transfer_with_py_spy(tmp_path: Path) -> None:
    """`--profile`: py-spy (a dev dependency) samples each serving provider while its transfer
    runs, one PVC migration being enough to show the stacks are written."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "pyrigaud").symlink_to(Path(pyrigaud.__file__).parent)
    profiles = tmp_path / "profiles"
    arguments = [*TINY_MIGRATION, "--storages", "pvc", "--profile", str(profiles)]
    arguments = [*arguments, "--code", str(code)]
    arguments[arguments.index("--rounds") + 1] = "1"
    out = bench("migration_bench.py", *arguments, json_to=tmp_path / "out.json", timeout=600)
    assert "| v2l-pvc-mostly-empty-off | export (vsphere) |" in out
    stacks = sorted(path.name for path in profiles.iterdir())
    assert stacks == [
        "pyrigaud-bench-v2l-pvc-mostly-empty-off-export.txt",
        "pyrigaud-bench-v2l-pvc-mostly-empty-off-import.txt",
    ]
    assert all((profiles / name).stat().st_size > 0 for name in stacks)
