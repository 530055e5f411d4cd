"""What a hypervisor brings to the provider, and what the composition root gives it back.

Each hypervisor's package (`adapters/hypervisors/<name>/plugin.py`) offers one
`HypervisorPlugin`: its own settings (a pydantic model whose aliases are the environment
variables), its builder, the pyproject extra its dependencies come with, and its default
endpoint. The registry (`entrypoints/backends.py`) names each plugin in one line; the settings
validate the selected hypervisor's model from the same sources as the common settings, and the
container calls its builder with the `BackendServices` below. A plugin module imports its
hypervisor's library (libvirt-python, pyvmomi) only inside the builder, so the library is
needed only when that hypervisor is selected.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, cast

from pydantic import BaseModel, ConfigDict, ValidationInfo

from pyrigaud.application.backend import Backend
from pyrigaud.application.ports import Clock, Credentials
from pyrigaud.application.ports.image_judge import ImageJudge

SETTINGS_MODEL = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)
"""The model configuration of every settings model, the common one and each hypervisor's."""


class CommonSettings(Protocol):
    """The settings every hypervisor shares that a builder reads."""

    @property
    def endpoint(self) -> str:
        """PROVIDER_ENDPOINT, else the selected hypervisor's default endpoint."""
        ...

    @property
    def default_datastore(self) -> str:
        """PROVIDER_DEFAULT_DATASTORE: where a VM's disks go when its placement names none."""
        ...

    @property
    def image_url_allow_loopback(self) -> bool:
        """PYRIGAUD_IMAGE_URL_ALLOW_LOOPBACK: image downloads may reach loopback (tests)."""
        ...

    @property
    def owner_mark(self) -> str:
        """Who this provider is, stamped on what it makes."""
        ...

    @property
    def scratch_dir(self) -> str | None:
        """PYRIGAUD_TRANSFER_SCRATCH_DIR: where disk conversions keep anonymous scratch files
        (None: the system's temporary directory)."""
        ...


def common_settings(info: ValidationInfo) -> CommonSettings | None:
    """The common settings a hypervisor's model is validated beside, for a rule that spans
    both (vSphere needs PROVIDER_ENDPOINT); None when the model is validated on its own."""
    return cast("CommonSettings | None", info.context)


class HypervisorCounters(Protocol):
    """The counts a hypervisor's adapters bump, labelled with the hypervisor. Every series
    shows (at 0) from the start, whichever a hypervisor takes, so the first count is a rise a
    rate sees and a panel shows zero rather than no data."""

    @property
    def on_reconnect(self) -> Callable[[], None]:
        """A session re-established after a drop (pyrigaud_session_reconnects)."""
        ...

    @property
    def on_resync(self) -> Callable[[], None]:
        """An inventory cache read afresh after its feed broke (pyrigaud_inventory_resyncs)."""
        ...

    @property
    def on_round_trip(self) -> Callable[[], None]:
        """One call into the hypervisor's API (pyrigaud_hypervisor_round_trips)."""
        ...

    def on_hardware_fallback(self, device: str) -> Callable[[], None]:
        """A VM made from an imported disk given a device its guest was not known to have,
        for want of an equivalent (pyrigaud_hardware_fallbacks, by `device`: "disk_controller",
        "nic" or "firmware")."""
        ...


@dataclass(frozen=True)
class BackendServices:
    """What the composition root offers a builder; credentials are opened only by a builder
    that logs in (`credentials()`), so the fake never reads a Secret."""

    clock: Clock
    credentials: Callable[[], Credentials]
    image_judge: ImageJudge  # judges every untrusted image before a byte is stored
    counters: HypervisorCounters


OwnSettings = TypeVar("OwnSettings", bound=BaseModel)


@dataclass(frozen=True)
class HypervisorPlugin(Generic[OwnSettings]):
    """One hypervisor, as the registry names it.

    `settings` is validated (with the common settings as its validation context) only when
    the hypervisor is selected, but its names are known settings whatever is selected, so one
    config file serves every PROVIDER_TYPE. `build` makes the ports; a missing library shows
    there as the ImportError that asks for `extra`.
    """

    settings: type[OwnSettings]
    build: Callable[[CommonSettings, OwnSettings, BackendServices], Backend]
    extra: str | None  # the pyproject extra its dependencies come with
    default_endpoint: str = ""  # PROVIDER_ENDPOINT when unset
