"""The hypervisor registry: PROVIDER_TYPE -> the plugin module of that hypervisor's package.

A hypervisor's settings, builder, extra and default endpoint live in its own folder
(`adapters/hypervisors/<name>/plugin.py`, a `HypervisorPlugin`); adding one is that folder,
one line here and its extra in pyproject.toml. A plugin module is light: it imports its
hypervisor's library only when its builder runs, so every plugin's settings are known while
only the selected hypervisor's library is needed.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import import_module
from typing import TYPE_CHECKING, Any

from pyrigaud.application.backend import Backend
from pyrigaud.application.hypervisor_plugin import (
    BackendServices,
    HypervisorPlugin,
)
from pyrigaud.application.setting_values import one_of

if TYPE_CHECKING:
    from pyrigaud.entrypoints.settings import Settings

_PLUGIN_MODULES = {
    "fake": "pyrigaud.adapters.hypervisors.fake.plugin",
    "libvirt": "pyrigaud.adapters.hypervisors.libvirt.plugin",
    "vsphere": "pyrigaud.adapters.hypervisors.vsphere.plugin",
}
ALIASES = {"mock": "fake"}
DEFAULT = "libvirt"  # on its test driver: a provider that runs with no setting at all


def _plugin(module: str) -> HypervisorPlugin[Any]:
    plugin = import_module(module).PLUGIN
    if not isinstance(plugin, HypervisorPlugin):
        raise TypeError(f"{module}.PLUGIN is not a HypervisorPlugin")
    return plugin


BACKENDS: Mapping[str, HypervisorPlugin[Any]] = {
    name: _plugin(module) for name, module in _PLUGIN_MODULES.items()
}


def backend_named(value: str) -> str:
    """PROVIDER_TYPE's hypervisor: a registered name or alias, any case; empty: the default."""
    backend = one_of(value, (*BACKENDS, *ALIASES), default=DEFAULT)
    return ALIASES.get(backend, backend)


def build_backend(settings: Settings, services: BackendServices) -> Backend:
    """The selected hypervisor's ports, from the common settings and its own."""
    plugin = BACKENDS[settings.provider_type]
    own = plugin.settings() if settings.hypervisor is None else settings.hypervisor
    return plugin.build(settings, own, services)
