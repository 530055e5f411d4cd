"""Every expected failure has one gRPC code, and none of them is UNKNOWN or INTERNAL by accident."""

from __future__ import annotations

import grpc

from pyrigaud.domain.errors import ErrorKind
from pyrigaud.entrypoints.grpc.status import STATUS_BY_KIND


def test_every_error_kind_has_a_status() -> None:
    assert set(STATUS_BY_KIND) == set(ErrorKind)


def test_refused_credentials_are_permission_denied() -> None:
    assert STATUS_BY_KIND[ErrorKind.PERMISSION_DENIED] is grpc.StatusCode.PERMISSION_DENIED
