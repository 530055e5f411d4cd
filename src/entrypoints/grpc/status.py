"""The one table from error kinds to gRPC status codes (docs/contract.md: status codes).

The manager's circuit breaker counts UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL and UNKNOWN
against every VM on the provider, so no expected failure maps to INTERNAL/UNKNOWN: INTERNAL is
only the servicer's answer to an exception (a bug).
"""

from __future__ import annotations

import grpc

from pyrigaud.domain.errors import ErrorKind

STATUS_BY_KIND: dict[ErrorKind, grpc.StatusCode] = {
    ErrorKind.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorKind.INVALID_SPEC: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorKind.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    ErrorKind.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    ErrorKind.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    ErrorKind.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorKind.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
}
