"""libvirt as the registry knows it: its settings and its builder. libvirt-python is imported
only inside the builder, so it is needed only when PROVIDER_TYPE is libvirt."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

from pyrigaud.application.backend import Backend
from pyrigaud.application.hypervisor_plugin import (
    SETTINGS_MODEL,
    BackendServices,
    CommonSettings,
    HypervisorPlugin,
)
from pyrigaud.application.setting_values import Flag, one_of

DOMAIN_TYPES = ("auto", "kvm", "qemu", "test")


class LibvirtSettings(BaseModel):
    model_config = SETTINGS_MODEL

    domain_type: str = Field("auto", alias="LIBVIRT_DOMAIN_TYPE")
    insecure_skip_host_key_verification: Flag = Field(
        False, alias="LIBVIRT_INSECURE_SKIP_HOST_KEY_VERIFICATION"
    )
    # Every libvirt call, reads included (PYRIGAUD_MAX_CONCURRENT_OPS bounds mutations only).
    max_concurrent_calls: int = Field(64, alias="LIBVIRT_MAX_CONCURRENT_CALLS", ge=1, le=4096)

    @field_validator("domain_type")
    @classmethod
    def _known_domain_type(cls, value: str) -> str:
        return one_of(value, DOMAIN_TYPES, default="auto")


def build(common: CommonSettings, own: LibvirtSettings, services: BackendServices) -> Backend:
    """Remote (`qemu+ssh://`, `qemu+libssh://`) endpoints take their SSH key, known_hosts and
    password from the credentials; each reopen after a lost connection is counted, each call
    into libvirt the ports make (a Describe the domain cache answers makes none), each time the
    domain cache is read afresh because its event feed broke, and each device a migrated guest
    gets for want of an equivalent."""
    from pyrigaud.adapters.hypervisors.libvirt.backend import (  # noqa: PLC0415
        build_libvirt_backend,
    )
    from pyrigaud.adapters.hypervisors.libvirt.connection import (  # noqa: PLC0415
        LibvirtConnection,
    )
    from pyrigaud.adapters.hypervisors.libvirt.device_models import (  # noqa: PLC0415
        DISK_CONTROLLER_DEVICE,
        NIC_DEVICE,
        FallbackCounts,
    )
    from pyrigaud.adapters.hypervisors.libvirt.storage import PoolSettings  # noqa: PLC0415

    connection = LibvirtConnection(
        common.endpoint,
        credentials=services.credentials(),
        verify_host_key=not own.insecure_skip_host_key_verification,
        max_concurrent_calls=own.max_concurrent_calls,
        on_reconnect=services.counters.on_reconnect,
        on_round_trip=services.counters.on_round_trip,
    )
    return build_libvirt_backend(
        connection,
        services.clock,
        domain_type=own.domain_type,  # `auto`: resolved per connection
        pools=PoolSettings(default_pool=common.default_datastore or "default"),
        allow_loopback_urls=common.image_url_allow_loopback,
        image_judge=services.image_judge,
        transfer_owner=common.owner_mark,
        scratch_dir=common.scratch_dir,
        hardware_fallbacks=FallbackCounts(
            disk_controller=services.counters.on_hardware_fallback(DISK_CONTROLLER_DEVICE),
            nic=services.counters.on_hardware_fallback(NIC_DEVICE),
        ),
        on_resync=services.counters.on_resync,
    )


PLUGIN = HypervisorPlugin(
    settings=LibvirtSettings, build=build, extra="libvirt", default_endpoint="test:///default"
)
