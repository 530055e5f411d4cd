"""The environment adapter: PYRIGAUD_CREDENTIAL_<NAME> variables to keys."""

from __future__ import annotations

import pytest

from pyrigaud.adapters.credentials.environment import EnvironmentCredentials, key_for_variable


@pytest.mark.parametrize(
    ("suffix", "key"),
    [
        ("USERNAME", "username"),
        ("PASSWORD", "password"),
        ("SSH_PRIVATEKEY", "ssh-privatekey"),
        ("KNOWN__HOSTS", "known_hosts"),
    ],
)
def test_a_variable_suffix_maps_to_its_key(suffix: str, key: str) -> None:
    assert key_for_variable(suffix) == key


def test_prefixed_variables_become_trimmed_keys_and_nothing_else_does() -> None:
    environ = {
        "PYRIGAUD_CREDENTIAL_USERNAME": " admin\n",
        "PYRIGAUD_CREDENTIAL_SSH_PRIVATEKEY": "-----BEGIN KEY-----\nabc\n-----END KEY-----\n",
        "PYRIGAUD_CREDENTIALS": "env",
        "PYRIGAUD_CREDENTIALS_DIR": "/etc/virtrigaud/credentials",
        "PYRIGAUD_CREDENTIAL_": "no name",
        "HOME": "/root",
    }

    values = EnvironmentCredentials(environ).current()

    assert dict(values) == {
        "username": "admin",
        "ssh-privatekey": "-----BEGIN KEY-----\nabc\n-----END KEY-----",
    }


def test_refresh_reads_the_environment_again() -> None:
    environ = {"PYRIGAUD_CREDENTIAL_PASSWORD": "old"}
    credentials = EnvironmentCredentials(environ)
    environ["PYRIGAUD_CREDENTIAL_PASSWORD"] = "new"

    assert credentials.current()["password"] == "old"
    assert credentials.refresh()["password"] == "new"
    assert credentials.current()["password"] == "new"


def test_the_process_environment_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYRIGAUD_CREDENTIAL_USERNAME", "from-env")

    assert EnvironmentCredentials().current()["username"] == "from-env"


def test_no_value_appears_in_reprs() -> None:
    credentials = EnvironmentCredentials({"PYRIGAUD_CREDENTIAL_PASSWORD": "hunter2"})
    values = credentials.current()

    for text in (repr(credentials), str(credentials), repr(values), str(values)):
        assert "hunter2" not in text
    assert "password" in repr(values)
