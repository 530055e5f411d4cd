"""vSphere as the registry knows it: its settings and its builder. pyvmomi is imported only
inside the builder, so it is needed only when PROVIDER_TYPE is vsphere."""

from __future__ import annotations

from pydantic import BaseModel, Field, ValidationInfo, model_validator

from pyrigaud.application.backend import Backend
from pyrigaud.application.hypervisor_plugin import (
    SETTINGS_MODEL,
    BackendServices,
    CommonSettings,
    HypervisorPlugin,
    common_settings,
)
from pyrigaud.application.setting_values import Flag
from pyrigaud.domain.models import Placement


class VSphereSettings(BaseModel):
    """The placement defaults (PROVIDER_DEFAULT_DATASTORE, shared with the other hypervisors,
    is a common setting) and vCenter's certificate check."""

    model_config = SETTINGS_MODEL

    default_storage_pod: str = Field("", alias="PROVIDER_DEFAULT_STORAGE_POD")
    default_cluster: str = Field("", alias="PROVIDER_DEFAULT_CLUSTER")
    default_folder: str = Field("", alias="PROVIDER_DEFAULT_FOLDER")
    tls_insecure_skip_verify: Flag = Field(False, alias="TLS_INSECURE_SKIP_VERIFY")

    @model_validator(mode="after")
    def _endpoint_given(self, info: ValidationInfo) -> VSphereSettings:
        common = common_settings(info)
        if common is not None and not common.endpoint:
            raise ValueError("PROVIDER_ENDPOINT (https://vcenter/sdk) is required for vsphere")
        return self


def build(common: CommonSettings, own: VSphereSettings, services: BackendServices) -> Backend:
    """One session (no round trip until the first call), logged in again after it expires
    (counted, as is each call the ports make into vCenter: the inventory feed's long-poll is
    not one), its waits and the ports' marks on the provider's clock."""
    from pyrigaud.adapters.hypervisors.vsphere.backend import (  # noqa: PLC0415
        vsphere_backend,
    )
    from pyrigaud.adapters.hypervisors.vsphere.device_models import (  # noqa: PLC0415
        FallbackCounters,
    )
    from pyrigaud.adapters.hypervisors.vsphere.session import (  # noqa: PLC0415
        VSphereSession,
        credentials_from,
    )

    session = VSphereSession(
        common.endpoint,
        credentials_from(services.credentials()),
        own.tls_insecure_skip_verify,
        services.counters.on_reconnect,
        services.counters.on_round_trip,
        clock=services.clock,
    )
    return vsphere_backend(
        session,
        clock=services.clock,
        defaults=Placement(
            datastore=common.default_datastore,
            storage_pod=own.default_storage_pod,
            cluster=own.default_cluster,
            folder=own.default_folder,
        ),
        allow_loopback_urls=common.image_url_allow_loopback,
        on_resync=services.counters.on_resync,
        owner=common.owner_mark,
        image_judge=services.image_judge,
        scratch_dir=common.scratch_dir,
        fallbacks=FallbackCounters(
            disk_controller=services.counters.on_hardware_fallback("disk_controller"),
            nic=services.counters.on_hardware_fallback("nic"),
        ),
    )


PLUGIN = HypervisorPlugin(settings=VSphereSettings, build=build, extra="vsphere")
