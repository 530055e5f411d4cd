"""Adding a hypervisor touches only its own folder plus one registry line (and its pyproject
extra): the composition root names no hypervisor, and each hypervisor's plugin module, which
every start-up imports, stays light."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pyrigaud.application.hypervisor_plugin import HypervisorPlugin
from pyrigaud.entrypoints import backends
from pyrigaud.entrypoints.backends import ALIASES, BACKENDS
from pyrigaud.entrypoints.settings import setting_names

ENTRYPOINTS = Path(backends.__file__).parent
COMPOSITION = ("settings.py", "backends.py", "container.py", "bootstrap.py", "cli.py")
LIBRARIES = ("libvirt", "libvirt_qemu", "pyVmomi", "pyVim")


def _hypervisor_words() -> re.Pattern[str]:
    """A registered hypervisor's name (any case), an alias of one, or a setting of its own."""
    owned = {name for plugin in BACKENDS.values() for name in setting_names(plugin.settings)}
    words = sorted({*BACKENDS, *ALIASES, *owned})
    return re.compile(r"\b(" + "|".join(map(re.escape, words)) + r")\b", re.IGNORECASE)


def _naming_lines(module: str) -> list[str]:
    text = (ENTRYPOINTS / module).read_text()
    return [line.strip() for line in text.splitlines() if _hypervisor_words().search(line)]


@pytest.mark.parametrize("module", [m for m in COMPOSITION if m != "backends.py"])
def test_the_composition_root_names_no_hypervisor(module: str) -> None:
    assert _naming_lines(module) == []


def test_the_registry_names_each_hypervisor_in_one_line() -> None:
    """Besides the `mock` alias and the default type, a hypervisor's name is on its one line."""
    lines = [
        line
        for line in _naming_lines("backends.py")
        if not line.startswith(("ALIASES = ", "DEFAULT = "))
    ]
    assert sorted(lines) == sorted(
        f'"{name}": "pyrigaud.adapters.hypervisors.{name}.plugin",' for name in BACKENDS
    )
    assert all(isinstance(plugin, HypervisorPlugin) for plugin in BACKENDS.values())


def test_no_hypervisor_setting_is_also_a_common_one() -> None:
    """A setting has one home: the common settings or one hypervisor's."""
    from pyrigaud.entrypoints.settings import Settings  # noqa: PLC0415

    homes = [setting_names(Settings), *(setting_names(p.settings) for p in BACKENDS.values())]
    every = [name for names in homes for name in names]
    assert len(every) == len(set(every))


def test_the_settings_and_every_plugin_load_without_a_hypervisors_library() -> None:
    """What every start-up imports (the settings, each plugin module) leaves libvirt-python
    and pyvmomi unloaded, and of each hypervisor's package only its plugin module."""
    probe = (
        "import json, sys\n"
        "import pyrigaud.entrypoints.settings\n"
        f"heavy = [m for m in sys.modules if m.split('.')[0] in {LIBRARIES!r}]\n"
        "beyond = [m for m in sys.modules if m.startswith('pyrigaud.adapters.hypervisors.')\n"
        "          and m.count('.') > 3 and not m.endswith('.plugin')]\n"
        "print(json.dumps([heavy, beyond]))\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(ran.stdout) == [[], []]
