"""Loaded before any test module: the process-wide settings every test process needs, the skip
policy (support.skip_policy), and the QEMU tests' skip when the run does not want QEMU."""

# Import the entrypoints package first: it turns gRPC's fork handlers off before grpc is
# imported (see its docstring), as `pyrigaud serve` does, for the servers tests run in-process.
from collections.abc import Iterator
from pathlib import Path

import pytest

import pyrigaud.entrypoints  # noqa: F401

from support.qemu_wanted import QEMU_FOLDERS, QEMU_NOT_WANTED, qemu_enabled
from support.staging import NfsServer, S3Server, ganesha_nfs, moto_s3

pytest_plugins = ["support.skip_policy"]

TESTS = Path(__file__).parent


def _needs_qemu(item: pytest.Item) -> bool:
    if item.get_closest_marker("qemu") is not None:
        return True
    where = item.path.relative_to(TESTS).as_posix()
    return any(where.startswith(f"{folder}/") for folder in QEMU_FOLDERS)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test is collected in every run; what needs the real libvirtd + QEMU is marked
    `qemu`, and skipped with its reason when the run does not want QEMU."""
    wanted = qemu_enabled()
    for item in items:
        if _needs_qemu(item):
            item.add_marker(pytest.mark.qemu)
            if not wanted:
                item.add_marker(pytest.mark.skip(reason=QEMU_NOT_WANTED))


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """moto's S3 server on loopback, one for the test session (started on first use)."""
    with moto_s3(tmp_path_factory.mktemp("moto")) as server:
        yield server


@pytest.fixture(scope="session")
def nfs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NfsServer]:
    """nfs-ganesha on loopback, one for the test session (started on first use)."""
    with ganesha_nfs(tmp_path_factory.mktemp("ganesha")) as server:
        yield server
