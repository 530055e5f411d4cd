"""LibvirtConnection on the test driver, and the SSH material it hands libvirt."""

from __future__ import annotations

import stat
import threading
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import libvirt

from pyrigaud.adapters.hypervisors.libvirt.connection import (
    LibvirtConnection,
    credential_answerer,
)
from pyrigaud.adapters.hypervisors.libvirt.ssh_access import SshAccess, display_uri
from pyrigaud.domain.errors import ErrorKind

from support import error_of, ok

SECRET = {
    "username": "ops admin",
    "password": "hunter2",
    "ssh-privatekey": "-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n-----END OPENSSH PRIVATE KEY-----",
    "known_hosts": "[host.example]:2222 ssh-ed25519 AAAA",
}


class CountingCredentials:
    """A credentials port that remembers how often it was read."""

    def __init__(self) -> None:
        self.reads = 0

    def current(self) -> Mapping[str, str]:
        self.reads += 1
        return SECRET

    def refresh(self) -> Mapping[str, str]:
        return self.current()


def parameters(uri: str) -> dict[str, str]:
    return {name: values[0] for name, values in parse_qs(urlsplit(uri).query).items()}


def test_the_key_is_copied_to_a_private_file_and_removed_on_close() -> None:
    access = SshAccess("qemu+ssh://host.example:2222/system?mode=legacy")
    uri = access.uri_for(SECRET)
    query = parameters(uri)
    key = Path(query["keyfile"])
    assert key.read_text() == SECRET["ssh-privatekey"] + "\n"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    assert query["mode"] == "legacy"  # the operator's own parameters stay
    assert query["no_tty"] == "1"
    assert "no_verify" not in query
    config = (key.parent / "ssh_config").read_text()
    assert "StrictHostKeyChecking yes" in config
    assert (key.parent / "known_hosts").read_text() == SECRET["known_hosts"] + "\n"
    assert urlsplit(uri).netloc == "ops%20admin@host.example:2222"
    access.close()
    assert not key.parent.exists()


def test_libssh_gets_known_hosts_and_auth_methods_itself() -> None:
    access = SshAccess("qemu+libssh://root@host.example/system")
    query = parameters(access.uri_for(SECRET))
    assert Path(query["known_hosts"]).read_text() == SECRET["known_hosts"] + "\n"
    assert query["known_hosts_verify"] == "normal"
    assert query["sshauth"] == "privkey,password"
    assert urlsplit(access.uri_for(SECRET)).username == "root"  # the URI's user wins
    access.close()


def test_skipping_host_key_verification_is_explicit_per_transport() -> None:
    ssh = SshAccess("qemu+ssh://host.example/system", verify_host_key=False)
    libssh = SshAccess("qemu+libssh://host.example/system", verify_host_key=False)
    assert parameters(ssh.uri_for(SECRET))["no_verify"] == "1"
    assert parameters(libssh.uri_for(SECRET))["known_hosts_verify"] == "ignore"
    ssh.close()
    libssh.close()


def test_local_uris_are_opened_as_given_without_reading_credentials() -> None:
    credentials = CountingCredentials()
    connection = LibvirtConnection("test:///default", credentials=credentials)
    assert ok(connection.call(lambda conn: conn.getURI())) == "test:///default"
    assert credentials.reads == 0
    connection.close()


def test_shown_uris_hide_a_password() -> None:
    assert display_uri("qemu+tcp://ops:hunter2@host/system") == "qemu+tcp://ops:***@host/system"


def test_the_auth_callback_answers_names_and_passwords_from_the_credentials() -> None:
    requests = [
        [libvirt.VIR_CRED_AUTHNAME, "name", "", "default", None],
        [libvirt.VIR_CRED_PASSPHRASE, "password", "", "", None],
        [libvirt.VIR_CRED_NOECHOPROMPT, "password again", "", "", None],
    ]
    assert credential_answerer(SECRET)(requests, None) == 0
    assert [request[4] for request in requests] == ["ops admin", "hunter2", "hunter2"]
    missing = [[libvirt.VIR_CRED_PASSPHRASE, "password", "", "", None]]
    assert credential_answerer({})(missing, None) == -1


def test_calls_beyond_the_bound_wait_and_then_are_resource_exhausted() -> None:
    connection = LibvirtConnection("test:///default", max_concurrent_calls=1, slot_wait_seconds=0)
    inside, release = threading.Event(), threading.Event()

    def hold(conn: object) -> None:
        inside.set()
        release.wait()

    holder = threading.Thread(target=connection.call, args=(hold,))
    holder.start()
    inside.wait()
    refused = error_of(connection.call(lambda conn: conn.getURI()))
    assert refused.kind is ErrorKind.RESOURCE_EXHAUSTED
    assert "1 libvirt call slots" in refused.message
    release.set()
    holder.join()
    assert ok(connection.call(lambda conn: conn.getURI())) == "test:///default"
    connection.close()


class CloseWatcher:
    def __init__(self) -> None:
        self.alive_when_told: list[bool] = []

    def closing(self, conn: object) -> None:
        self.alive_when_told.append(bool(conn.isAlive()))  # type: ignore[attr-defined]


def test_close_hooks_see_the_connection_while_it_is_still_open() -> None:
    connection = LibvirtConnection("test:///default")
    watcher = CloseWatcher()
    connection.on_close(watcher.closing)
    ok(connection.call(lambda conn: conn.getHostname()))
    connection.close()
    connection.close()  # nothing open: nothing to tell
    assert watcher.alive_when_told == [True]


def test_the_auth_callback_gives_a_password_once_per_open() -> None:
    answer = credential_answerer(SECRET)
    name = [[libvirt.VIR_CRED_AUTHNAME, "name", "", "", None]]
    password = [[libvirt.VIR_CRED_PASSPHRASE, "password", "", "", None]]
    assert answer(name, None) == 0
    assert answer(password, None) == 0
    assert answer(password, None) == -1  # asked again: refused, and it would be again
