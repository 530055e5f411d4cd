"""One staging case per backend (pvc, s3, nfs), each on its real storage, for the contract suite."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.staging import (
    StagingCase,
    migration_name,
    nfs_case,
    pvc_case,
    s3_case,
)


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


@pytest.fixture(params=["s3", "nfs"])
def remote_staging(request: pytest.FixtureRequest, tmp_path: Path) -> StagingCase:
    """The backends the manager's requests alone name (no PVC mounted in the pod)."""
    return make_case(request.param, request, tmp_path / "migration-storage")
