"""The composition root picks adapters by configuration alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyrigaud.adapters.credentials.environment import EnvironmentCredentials
from pyrigaud.adapters.credentials.mounted_secret import MountedSecretCredentials
from pyrigaud.application.backend import Backend
from pyrigaud.entrypoints.container import build_container
from pyrigaud.entrypoints.settings import SettingsError, load_settings


def adapter_package(backend: Backend) -> str:
    """The backend package every port of `backend` comes from."""
    packages = {
        type(port).__module__.split(".")[3] for port in vars(backend).values() if port is not None
    }
    assert len(packages) == 1, packages
    return packages.pop()


def test_the_backend_is_chosen_by_provider_type() -> None:
    assert adapter_package(build_container(load_settings({})).backend()) == "libvirt"
    fake = build_container(load_settings({"PROVIDER_TYPE": "fake"})).backend()
    assert adapter_package(fake) == "fake"


def test_the_credentials_source_is_chosen_by_configuration(tmp_path: Path) -> None:
    files = build_container(
        load_settings({"PYRIGAUD_CREDENTIALS_DIR": str(tmp_path)})
    ).credentials()
    assert isinstance(files, MountedSecretCredentials)
    env = build_container(load_settings({"PYRIGAUD_CREDENTIALS": "env"})).credentials()
    assert isinstance(env, EnvironmentCredentials)


def test_kubernetes_credentials_need_a_secret_name() -> None:
    with pytest.raises(SettingsError, match="PYRIGAUD_CREDENTIALS_SECRET"):
        load_settings({"PYRIGAUD_CREDENTIALS": "kubernetes"})
    with pytest.raises(SettingsError, match="PYRIGAUD_CREDENTIALS"):
        load_settings({"PYRIGAUD_CREDENTIALS": "vault"})


def test_the_mutation_rate_limit_is_configured_from_settings() -> None:
    limiter = build_container(
        load_settings({"PYRIGAUD_RATE_QPS": "5", "PYRIGAUD_RATE_BURST": "1"})
    ).limiter()
    with limiter.slot(None) as first:
        assert first
    with limiter.slot(0.0) as second:  # no time left for the next token
        assert not second
        assert "rate limit of 5" in second.refusal
