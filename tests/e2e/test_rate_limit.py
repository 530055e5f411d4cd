"""The per-backend rate limit on mutations, over real gRPC on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2 as pb
from pyrigaud.entrypoints.grpc.generated.provider.v1 import provider_pb2_grpc as pb_grpc
from pyrigaud.entrypoints.grpc.limits import MutationLimiter, TokenBucket

from support import ManualClock
from support.e2e import CLASS_JSON, create_vm, start_provider


@pytest.fixture
def token_waits() -> list[float]:
    """Each wait of the provider's token bucket for a token, in seconds."""
    return []


class WaitsRecorded(ManualClock):
    """A manual clock whose waits are recorded in `waits`."""

    def __init__(self, waits: list[float]) -> None:
        super().__init__()
        self._waits = waits

    def sleep(self, seconds: float) -> None:
        self._waits.append(seconds)
        super().sleep(seconds)


@pytest.fixture
def stub(token_waits: list[float]) -> Iterator[pb_grpc.ProviderStub]:
    """A provider allowing 2 mutations a second, 2 at once saved up. The bucket's time is a
    manual clock that only its waits move: however slow the machine, no token comes back
    by itself between two calls, and a wait costs no real time."""
    clock = WaitsRecorded(token_waits)
    bucket = TokenBucket(rate=2, burst=2, clock=clock)
    limiter = MutationLimiter(max_concurrent=8, rate_limit=bucket, clock=clock)
    running = start_provider(limiter=limiter)
    yield running.stub
    running.channel.close()
    running.application.stop(0)


def test_creates_beyond_the_burst_with_a_short_deadline_get_resource_exhausted(
    stub: pb_grpc.ProviderStub,
) -> None:
    first = create_vm(stub, "e2e-rate-1")
    create_vm(stub, "e2e-rate-2")
    for name in ("e2e-rate-3", "e2e-rate-4"):
        # 1.05 s leaves 0.05 s after the deadline margin; the next token is ~0.5 s away.
        with pytest.raises(grpc.RpcError) as raised:
            stub.Create(pb.CreateRequest(name=name, class_json=CLASS_JSON), timeout=1.05)
        assert raised.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "rate limit of 2 mutations/s reached" in (raised.value.details() or "")
        assert stub.Describe(pb.DescribeRequest(id=first), timeout=10).exists
    assert stub.Validate(pb.ValidateRequest(), timeout=10).ok
    listed = stub.ListVMs(pb.ListVMsRequest(), timeout=5)
    assert sorted(vm.name for vm in listed.vms) == ["e2e-rate-1", "e2e-rate-2"]


def test_creates_beyond_the_burst_with_a_generous_deadline_wait_and_succeed(
    stub: pb_grpc.ProviderStub, token_waits: list[float]
) -> None:
    first = create_vm(stub, "e2e-wait-1")
    create_vm(stub, "e2e-wait-2")
    with ThreadPoolExecutor(2) as pool:
        waiting = [pool.submit(create_vm, stub, f"e2e-wait-{index}") for index in (3, 4)]
        assert stub.Describe(pb.DescribeRequest(id=first), timeout=10).exists
        assert all(future.result(timeout=10) for future in waiting)
    # The burst served the first two at once; the 3rd and 4th each waited for their token.
    assert len(token_waits) == 2, token_waits
    assert all(wait > 0 for wait in token_waits), token_waits
