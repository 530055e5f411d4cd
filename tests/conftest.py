"""Loaded before any test module: the process-wide settings every test process needs, and the
skip policy (support.skip_policy)."""

# Import the entrypoints package first: it turns gRPC's fork handlers off before grpc is
# imported (see its docstring), as `pyrigaud serve` does, for the servers tests run in-process.
from collections.abc import Iterator

import pytest

import pyrigaud.entrypoints  # noqa: F401

from support.staging import NfsServer, S3Server, ganesha_nfs, moto_s3

pytest_plugins = ["support.skip_policy"]


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
