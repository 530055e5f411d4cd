"""The StorageGate port: a staging store's host resolved once, every address checked by the
domain's rule (`domain/staging_gate.py`), and the first one pinned on the location, so the
store's connections go to the address that was checked (a DNS answer that changes between the
check and the connection cannot move them).

Which host a location's connections go to is its type's to say (`location.options.host()`):
a PVC is a mounted folder, nothing to reach; S3 without an endpoint is AWS itself, reached by
name as boto3 does (its host is AWS's, whatever the request says).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from returns.result import Failure, Result, Success

from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.staging import StagedLocation
from pyrigaud.domain.staging_gate import StagingGate


@dataclass(frozen=True)
class ResolvingGate:
    gate: StagingGate

    def admitted(self, location: StagedLocation) -> Result[StagedLocation, ProviderError]:
        reached = location.options.host()
        if reached is None:
            return Success(location)
        field, host, port = reached.field, reached.host, reached.port
        try:
            answers = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as error:
            return Failure(
                ProviderError.unavailable(f"{field}: cannot resolve {host!r}: {error}").mentioning(
                    field
                )
            )
        addresses = list(dict.fromkeys(str(answer[4][0]) for answer in answers))
        for address in addresses:
            refusal = self.gate.refusal(address)
            if refusal is not None:
                return Failure(
                    ProviderError.permission_denied(
                        f"{field}: {host} is not a place this provider may reach ({refusal}); "
                        "nothing was sent there"
                    ).mentioning(field)
                )
        # Every address was checked; the pin is one of them, IPv4 first: a pinned connection
        # cannot fall back to the next address as a resolver's caller would, and a store
        # named in both families listens on IPv4 more often than not.
        pinned = min(addresses, key=lambda address: ":" in address)
        return Success(location.model_copy(update={"address": pinned}))
