"""The URI libvirt opens for `PROVIDER_ENDPOINT`, with the SSH key and known_hosts of the
credentials port in private files.

A mounted Secret is read-only and world-readable to the pod, and ssh refuses a key file that
others can read, so the key is copied to a 0600 file in a 0700 directory of our own, rewritten
at every (re)open so that rotated credentials take effect. libvirt's two SSH transports differ:

- `+libssh` / `+libssh2` connect in-process and take `keyfile=`, `known_hosts=`,
  `known_hosts_verify=` and `sshauth=` themselves;
- `+ssh` runs the ssh binary, passing `keyfile=` as `-i` and `no_verify=1` as
  `StrictHostKeyChecking=no`, but has no `known_hosts` parameter: its `command=` (the binary
  to run) names a small wrapper here that runs ssh with a config file of our own, which pins
  `UserKnownHostsFile` to the Secret's copy and keeps `StrictHostKeyChecking yes`.

Every other transport (`qemu:///system`, `test:///...`, TLS) is opened as given.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import tempfile
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from urllib.parse import SplitResult, parse_qsl, quote, urlencode, urlsplit, urlunsplit

from returns.result import Failure, Result, Success

from pyrigaud.domain.errors import ProviderError

# The libvirt provider Secret's keys (deploy/libvirt/credentials-secret.yaml).
PRIVATE_KEY = "ssh-privatekey"
KNOWN_HOSTS = "known_hosts"
USERNAME = "username"
PASSWORD = "password"  # noqa: S105 - the name of a Secret key, not a value

BINARY_SSH_TRANSPORTS = frozenset({"ssh"})
LIBSSH_TRANSPORTS = frozenset({"libssh", "libssh2"})

_log = logging.getLogger(__name__)


def transport_of(uri: str) -> str:
    """`qemu+ssh://...` -> `ssh`; no `+transport` -> ``."""
    scheme = urlsplit(uri).scheme
    return scheme.partition("+")[2].lower()


def display_uri(uri: str) -> str:
    """The URI without any password in its authority or query, for logs and error messages."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    user, _, host = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{user.partition(':')[0]}:***@{host}"))


class SshAccess:
    """Owns the private directory of one connection's key material; thread-unsafe on its own
    (the connection calls it under its lock)."""

    def __init__(self, uri: str, *, verify_host_key: bool = True) -> None:
        self.uri = uri
        self._transport = transport_of(uri)
        self._verify_host_key = verify_host_key
        self._directory: Path | None = None
        self._removal: Callable[[], object] = lambda: None
        # Only `+ssh` runs a client; once found it is not looked for again on every call.
        self._client_found = self._transport not in BINARY_SSH_TRANSPORTS
        if not verify_host_key and self.uses_ssh:
            _log.warning(
                "SSH host-key verification is off for %s "
                "(LIBVIRT_INSECURE_SKIP_HOST_KEY_VERIFICATION): the host is not authenticated",
                display_uri(uri),
            )

    @property
    def uses_ssh(self) -> bool:
        return self._transport in BINARY_SSH_TRANSPORTS | LIBSSH_TRANSPORTS

    def ready(self) -> Result[None, ProviderError]:
        """Whether this machine has what the transport runs: `+ssh` needs the ssh client."""
        self._client_found = self._client_found or shutil.which("ssh") is not None
        if not self._client_found:
            return Failure(
                ProviderError.unavailable(
                    f"{display_uri(self.uri)} needs the ssh client, which is not installed"
                )
            )
        return Success(None)

    def uri_for(self, values: Mapping[str, str]) -> str:
        """The URI to open with these credentials (once `ready`); writes (or rewrites) the
        private files."""
        if not self.uses_ssh:
            return self.uri
        parameters = dict(_query(self.uri))
        key = values.get(PRIVATE_KEY, "")
        known_hosts = values.get(KNOWN_HOSTS, "")
        key_path = self._write("id_key", key) if key else None
        known_hosts_path = self._write("known_hosts", known_hosts) if known_hosts else None
        if key_path is not None:
            parameters["keyfile"] = str(key_path)
        if self._transport in LIBSSH_TRANSPORTS:
            parameters.update(self._libssh_parameters(values, known_hosts_path))
        else:
            parameters.update(self._ssh_binary_parameters(key_path, known_hosts_path))
        parts = urlsplit(self.uri)
        netloc = _with_user(parts, values.get(USERNAME, ""))
        return urlunsplit(parts._replace(netloc=netloc, query=_encode(list(parameters.items()))))

    def close(self) -> None:
        self._removal()
        self._directory = None

    def _libssh_parameters(
        self, values: Mapping[str, str], known_hosts_path: Path | None
    ) -> dict[str, str]:
        parameters = {"known_hosts_verify": "normal" if self._verify_host_key else "ignore"}
        if known_hosts_path is not None:
            parameters["known_hosts"] = str(known_hosts_path)
        methods = [
            method
            for method, present in (("privkey", PRIVATE_KEY), ("password", PASSWORD))
            if values.get(present)
        ]
        if methods:
            parameters["sshauth"] = ",".join(methods)
        return parameters

    def _ssh_binary_parameters(
        self, key_path: Path | None, known_hosts_path: Path | None
    ) -> dict[str, str]:
        client = shutil.which("ssh") or "ssh"  # found by `ready`
        options = ["BatchMode yes"]
        if key_path is not None:
            options.append("IdentitiesOnly yes")
        if not self._verify_host_key:
            options += ["StrictHostKeyChecking no", "UserKnownHostsFile /dev/null"]
        else:
            options.append("StrictHostKeyChecking yes")
            if known_hosts_path is not None:
                options += [f'UserKnownHostsFile "{known_hosts_path}"', "GlobalKnownHostsFile none"]
        config = self._write("ssh_config", "\n".join(options))
        wrapper = self._write(
            "ssh",
            f'#!/bin/sh\nexec {shlex.quote(client)} -F {shlex.quote(str(config))} "$@"',
            0o700,
        )
        parameters = {"command": str(wrapper), "no_tty": "1"}
        if not self._verify_host_key:
            parameters["no_verify"] = "1"
        return parameters

    def _write(self, name: str, content: str, mode: int = 0o600) -> Path:
        """Replace the file atomically: a concurrent ssh never reads half a key."""
        if self._directory is None:
            self._directory = Path(tempfile.mkdtemp(prefix="pyrigaud-libvirt-ssh-"))  # 0700
            # Gone at close, and at interpreter exit for a connection nobody closed.
            self._removal = weakref.finalize(self, shutil.rmtree, self._directory, True)
        path = self._directory / name
        descriptor, staged = tempfile.mkstemp(dir=self._directory)
        try:
            os.fchmod(descriptor, mode)
            # Values come whitespace-trimmed; OpenSSH refuses a key without its final newline.
            os.write(descriptor, f"{content}\n".encode())
        finally:
            os.close(descriptor)
        os.replace(staged, path)
        return path


def _query(uri: str) -> list[tuple[str, str]]:
    return parse_qsl(urlsplit(uri).query, keep_blank_values=True)


def _encode(pairs: list[tuple[str, str]]) -> str:
    return urlencode(pairs, quote_via=quote, safe="/")


def _with_user(parts: SplitResult, username: str) -> str:
    """The authority with the Secret's username when the URI names none."""
    if parts.username or not username or not parts.hostname:
        return parts.netloc
    return f"{quote(username, safe='')}@{parts.netloc}"
