"""The fake as the registry knows it: its one setting and its builder (the in-memory
hypervisor's modules are imported only when it is built)."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

from pyrigaud.application.backend import Backend
from pyrigaud.application.hypervisor_plugin import (
    SETTINGS_MODEL,
    BackendServices,
    CommonSettings,
    HypervisorPlugin,
)


class FakeSettings(BaseModel):
    model_config = SETTINGS_MODEL

    latency: str = Field("", alias="PYRIGAUD_FAKE_LATENCY")  # "create=2,describe=0.01"

    @field_validator("latency")
    @classmethod
    def _latency_pairs(cls, value: str) -> str:
        _latencies(value)
        return value

    @property
    def latency_by_operation(self) -> dict[str, float]:
        return _latencies(self.latency)


def _latencies(text: str) -> dict[str, float]:
    """`operation=seconds,...` for the fake backend's latency injection (demos, load tests)."""
    latencies: dict[str, float] = {}
    for pair in filter(None, (part.strip() for part in text.split(","))):
        operation, _, seconds = pair.partition("=")
        try:
            latencies[operation.strip()] = float(seconds)
        except ValueError:
            raise ValueError(f"expected operation=seconds, got {pair!r}") from None
    return latencies


def build(common: CommonSettings, own: FakeSettings, services: BackendServices) -> Backend:
    """A fresh in-memory hypervisor with the configured datastore and injected latency, both
    its clocks the provider's."""
    from pyrigaud.adapters.hypervisors.fake.backend import fake_backend  # noqa: PLC0415
    from pyrigaud.adapters.hypervisors.fake.hypervisor import FakeHypervisor  # noqa: PLC0415

    return fake_backend(
        FakeHypervisor(
            services.clock,
            datastores=(common.default_datastore or "default",),
            latency=own.latency_by_operation,
        )
    )


PLUGIN = HypervisorPlugin(settings=FakeSettings, build=build, extra=None)
