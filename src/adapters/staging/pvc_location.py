"""The pvc staging type's rules: `pvc://<pvc>/<path>`, a file under the PVC's mount in the
provider's pod. It reads no storage option and takes no credentials; a sweep needs no place
named for it, since every mounted PVC is swept."""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import SplitResult

from returns.result import Result, Success

from pyrigaud.adapters.staging.rules import invalid
from pyrigaud.domain import fields
from pyrigaud.domain.errors import ProviderError
from pyrigaud.domain.staging import StagedLocation, StagingOptions, StagingType, relative_key

PVC = StagingType("pvc")
PVC_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")  # a Kubernetes name


class PvcRules:
    staging_type = PVC
    shape = "pvc://<pvc>/<path>, without query or fragment"
    option_keys = ()
    takes_query = False
    takes_credentials = False
    no_place = "every mounted PVC is swept"

    def options(self, options: Mapping[str, object]) -> Result[StagingOptions, ProviderError]:
        return Success(StagingOptions())

    def located(
        self,
        field: str,
        url: str,
        parts: SplitResult,
        options: StagingOptions,
        credentials: Mapping[str, str] | None,
    ) -> Result[StagedLocation, ProviderError]:
        pvc = parts.netloc
        if not PVC_NAME.fullmatch(pvc):
            return invalid(field, "the part after pvc:// must be a PVC name")
        return relative_key(field, parts.path.removeprefix("/")).map(
            lambda key: StagedLocation(
                staging_type=PVC, field=field, url=url, container=pvc, key=key, options=options
            )
        )

    def place_url(self, options: StagingOptions) -> Result[str, ProviderError]:
        return invalid(fields.STAGING_TYPE, self.no_place)
