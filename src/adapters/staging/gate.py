"""The StorageGate port: a staging store's host resolved, checked by the domain's rule
(`domain/staging_gate.py`) and pinned on the location as `pinning.pinned_address` does for
every connection to a host a request named, so the store's connections go to the address that
was checked (a DNS answer that changes between the check and the connection cannot move them).

Which host a location's connections go to is its type's to say (`location.options.host()`):
a PVC is a mounted folder, nothing to reach; S3 without an endpoint is AWS itself, reached by
name as boto3 does (its host is AWS's, whatever the request says).
"""

from __future__ import annotations

from dataclasses import dataclass

from returns.result import Result, Success

from pyrigaud.adapters.pinning import pinned_address
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
        field, host = reached.field, reached.host

        def refusal(address: str) -> ProviderError | None:
            refused = self.gate.refusal(address)
            if refused is None:
                return None
            return ProviderError.permission_denied(
                f"{field}: {host} is not a place this provider may reach ({refused}); "
                "nothing was sent there"
            ).mentioning(field)

        def unresolved(problem: str) -> ProviderError:
            return ProviderError.unavailable(f"{field}: {problem}").mentioning(field)

        def pinned(address: str) -> StagedLocation:
            return location.model_copy(update={"address": address})

        return pinned_address(host, reached.port, refusal, unresolved).map(pinned)
