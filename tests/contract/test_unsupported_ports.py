"""A backend lacking an optional port says so and answers that port's RPCs UNSUPPORTED."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from returns.result import Result

from pyrigaud.adapters.staging.registry import STAGING_TYPES
from pyrigaud.application.ports.transfer_metrics import UncountedTransfers
from pyrigaud.application.provider import ProviderUseCases
from pyrigaud.domain.errors import ErrorKind, ProviderError
from pyrigaud.domain.fields import SOURCE_URL
from pyrigaud.domain.leftovers import LeftoverPolicy
from pyrigaud.domain.models import (
    CloneRequest,
    DiskQuery,
    ExportRequest,
    ImageSource,
    ImportRequest,
    OwnerMark,
    PrepareImageRequest,
    SnapshotRequest,
)
from pyrigaud.entrypoints.container import provider_use_cases

from contract.conftest import harness_of, lacked_ports
from contract.test_health_contract import claimed_ports
from support import error_kind
from support.transfer import IMAGE_JUDGE, LOOPBACK_GATE, staged

# Each optional port's RPCs, as the servicer calls them.
CALLS_BY_PORT: dict[str, list[Callable[[Any], Result[object, ProviderError]]]] = {
    "snapshots": [
        lambda use: use.create_snapshot(SnapshotRequest(vm_id="x", name="s")),
        lambda use: use.delete_snapshot("x", "s"),
        lambda use: use.revert_snapshot("x", "s"),
    ],
    "cloning": [lambda use: use.clone_vm(CloneRequest(source_vm_id="x", target_name="y"))],
    "images": [
        lambda use: use.prepare_image(
            PrepareImageRequest(source=ImageSource(path="/x.qcow2"), target_name="x")
        )
    ],
    "disk_transfer": [
        lambda use: use.export_disk(ExportRequest(vm_id="x", destination=staged("pvc://p/x"))),
        lambda use: use.import_disk(
            ImportRequest(source=staged("pvc://p/x", field=SOURCE_URL), target_name="x")
        ),
        lambda use: use.get_disk_info(DiskQuery(vm_id="x")),
    ],
}


@pytest.mark.parametrize(("backend_name", "port"), lacked_ports())
def test_a_lacked_port_is_unsupported_and_unclaimed(
    backend_name: str, port: str, owner: OwnerMark
) -> None:
    for harness in harness_of(backend_name):
        assert getattr(harness.backend, port) is None
        assert not claimed_ports(harness.backend.capabilities.capabilities())[port]
        use: ProviderUseCases = provider_use_cases(
            harness.backend,
            harness.clock,
            harness.ownership(owner),
            staging=STAGING_TYPES.stores(owner.provider, harness.clock),
            judge=IMAGE_JUDGE,
            leftovers=LeftoverPolicy(owner=owner),
            transfer_metrics=UncountedTransfers(),
            storage_gate=LOOPBACK_GATE,
        )
        for call in CALLS_BY_PORT[port]:
            assert error_kind(call(use)) is ErrorKind.UNSUPPORTED
