"""The adapter contract suite's fixtures: one harness per hypervisor adapter.

Each harness gives the adapter (which implements every port) plus what a test needs that
only the backend knows how to make, such as an image a VM can be created from. New adapters
join by adding a harness to ADAPTERS.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from pyrigaud.adapters.clocks import ManualClock
from pyrigaud.adapters.hypervisors.fake.hypervisor import FakeHypervisor
from pyrigaud.domain.models import OwnerMark, VMImage

from contract.harness import Harness


def _fake() -> Iterator[Harness]:
    clock = ManualClock()
    adapter = FakeHypervisor(clock)
    adapter.add_image("/images/base.qcow2", size_gib=2)
    yield Harness(adapter=adapter, clock=clock, image=VMImage(path="/images/base.qcow2"))


ADAPTERS: dict[str, Callable[[], Iterator[Harness]]] = {"fake": _fake}


@pytest.fixture(params=sorted(ADAPTERS))
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    yield from ADAPTERS[request.param]()


@pytest.fixture
def owner() -> OwnerMark:
    return OwnerMark(provider="tests/contract")
