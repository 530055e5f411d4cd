"""Credentials from environment variables, for local development.

`PYRIGAUD_CREDENTIAL_<NAME>=value` becomes the key `<name>`: lowercased, each `_` turned into
`-`, and each `__` into a literal `_`. So `PYRIGAUD_CREDENTIAL_USERNAME` -> `username`,
`PYRIGAUD_CREDENTIAL_SSH_PRIVATEKEY` -> `ssh-privatekey`, `PYRIGAUD_CREDENTIAL_KNOWN__HOSTS`
-> `known_hosts`. (The settings `PYRIGAUD_CREDENTIALS*` do not match: the prefix ends in `_`.)
Values are whitespace-trimmed.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping

from pyrigaud.adapters.credentials.secret_values import SecretValues

PREFIX = "PYRIGAUD_CREDENTIAL_"


def key_for_variable(suffix: str) -> str:
    """`SSH_PRIVATEKEY` -> `ssh-privatekey`, `KNOWN__HOSTS` -> `known_hosts`."""
    return "_".join(part.replace("_", "-") for part in suffix.lower().split("__"))


class EnvironmentCredentials:
    """Reads the variables once and again on refresh(): a process's environment rarely changes."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = os.environ if environ is None else environ
        self._lock = threading.Lock()
        self._values = self._read()

    def current(self) -> Mapping[str, str]:
        return self._values

    def refresh(self) -> Mapping[str, str]:
        with self._lock:
            self._values = self._read()
            return self._values

    def _read(self) -> SecretValues:
        return SecretValues(
            {
                key_for_variable(name[len(PREFIX) :]): value.strip()
                for name, value in self._environ.items()
                if name.startswith(PREFIX) and len(name) > len(PREFIX)
            }
        )

    def __repr__(self) -> str:
        return f"EnvironmentCredentials(prefix={PREFIX!r})"
