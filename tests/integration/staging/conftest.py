"""One staging case per backend (pvc, s3, nfs), each on its real storage, for the contract suite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from staging_support import (
    NfsServer,
    S3Server,
    StagingCase,
    ganesha_nfs,
    migration_name,
    moto_s3,
    nfs_case,
    pvc_case,
    s3_case,
)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with moto_s3(tmp_path_factory.mktemp("moto")) as server:
        yield server


@pytest.fixture(scope="session")
def nfs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NfsServer]:
    with ganesha_nfs(tmp_path_factory.mktemp("ganesha")) as server:
        yield server


def make_case(kind: str, request: pytest.FixtureRequest, root: Path) -> StagingCase:
    migration = migration_name(request)
    if kind == "pvc":
        return pvc_case(root, migration)
    if kind == "s3":
        return s3_case(request.getfixturevalue("s3_server"), migration)
    return nfs_case(request.getfixturevalue("nfs_server"), migration)


@pytest.fixture(params=["pvc", "s3", "nfs"])
def staging(request: pytest.FixtureRequest, tmp_path: Path) -> StagingCase:
    return make_case(request.param, request, tmp_path / "migration-storage")


@pytest.fixture(params=["pvc", "nfs"])
def file_staging(request: pytest.FixtureRequest, tmp_path: Path) -> StagingCase:
    """The backends whose temporaries are named files carrying the owner mark (S3 lists
    uploads in progress without their metadata, so its sweep goes by age alone)."""
    return make_case(request.param, request, tmp_path / "migration-storage")
