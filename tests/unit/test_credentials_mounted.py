"""The mounted Secret adapter against real `..data` swaps, as the kubelet performs them."""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Mapping
from pathlib import Path

import pytest

from pyrigaud.adapters.credentials.mounted_secret import MountedSecretCredentials
from pyrigaud.adapters.credentials.secret_values import SecretValues


def publish(directory: Path, values: Mapping[str, str], version: int) -> None:
    """What the kubelet's AtomicWriter does: new version folder, swap `..data`, prune the old."""
    directory.mkdir(exist_ok=True)
    folder = directory / f"..2026_12_02_12_00_00.{version:09d}"
    folder.mkdir()
    for key, value in values.items():
        (folder / key).write_text(value)
    data = directory / "..data"
    previous = os.readlink(data) if data.is_symlink() else None
    os.symlink(folder.name, directory / "..data_tmp")
    os.replace(directory / "..data_tmp", data)
    for key in values:
        if not (directory / key).is_symlink():
            os.symlink(f"..data/{key}", directory / key)
    for entry in directory.iterdir():
        if not entry.name.startswith(".") and entry.name not in values:
            entry.unlink()
    if previous is not None:
        shutil.rmtree(directory / previous)


@pytest.fixture
def mount(tmp_path: Path) -> Path:
    directory = tmp_path / "credentials"
    publish(directory, {"username": " admin\n", "password": "s3cret\n"}, version=1)
    return directory


def test_reads_one_trimmed_value_per_key_and_skips_hidden_entries(mount: Path) -> None:
    values = MountedSecretCredentials(mount).current()

    assert dict(values) == {"username": "admin", "password": "s3cret"}
    assert sorted(os.listdir(mount))[0].startswith("..")  # the hidden entries were there


def test_a_rotation_is_served_without_a_restart_or_refresh(mount: Path) -> None:
    credentials = MountedSecretCredentials(mount)
    assert credentials.current()["password"] == "s3cret"

    publish(mount, {"username": "admin", "password": "rotated"}, version=2)

    assert dict(credentials.current()) == {"username": "admin", "password": "rotated"}


def test_each_rotation_is_reported_once_and_the_first_load_is_not(mount: Path) -> None:
    reloads: list[int] = []
    credentials = MountedSecretCredentials(mount, on_reload=lambda: reloads.append(1))
    credentials.current()
    credentials.current()
    assert reloads == []
    publish(mount, {"username": "admin", "password": "rotated"}, version=2)
    credentials.current()
    credentials.current()
    assert reloads == [1]
    publish(mount, {"username": "admin", "password": "rotated"}, version=3)  # same values
    credentials.current()
    assert reloads == [1]


def test_a_key_removed_by_a_rotation_is_gone(mount: Path) -> None:
    credentials = MountedSecretCredentials(mount)
    credentials.current()

    publish(mount, {"username": "admin"}, version=2)

    assert dict(credentials.current()) == {"username": "admin"}


def test_a_reader_never_sees_a_half_written_set_while_200_rotations_happen(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "credentials"
    publish(directory, {"username": "u0", "password": "p0"}, version=0)
    credentials = MountedSecretCredentials(directory)
    writer_done = threading.Event()
    seen_by_reader: list[list[int]] = [[], []]
    mixed: list[dict[str, str]] = []

    def read_until_the_writer_is_done(seen: list[int]) -> None:
        while not writer_done.is_set():
            values = dict(credentials.current())
            if values.keys() != {"username", "password"} or (
                values["username"][1:] != values["password"][1:]
            ):
                mixed.append(values)
            else:
                seen.append(int(values["username"][1:]))

    readers = [
        threading.Thread(target=read_until_the_writer_is_done, args=(seen,))
        for seen in seen_by_reader
    ]
    for reader in readers:
        reader.start()
    try:
        for version in range(1, 201):
            publish(directory, {"username": f"u{version}", "password": f"p{version}"}, version)
    finally:
        writer_done.set()
        for reader in readers:
            reader.join(timeout=30)

    assert mixed == []
    for seen in seen_by_reader:
        assert seen, "the reader ran"
        assert seen == sorted(seen), "a reader never goes back to an older version"
    assert dict(credentials.current()) == {"username": "u200", "password": "p200"}


def test_a_vanished_directory_keeps_the_last_good_set_and_warns_once(
    mount: Path, caplog: pytest.LogCaptureFixture
) -> None:
    credentials = MountedSecretCredentials(mount)
    assert credentials.current()["username"] == "admin"

    shutil.rmtree(mount)
    with caplog.at_level(logging.WARNING):
        assert dict(credentials.current()) == {"username": "admin", "password": "s3cret"}
        assert dict(credentials.refresh()) == {"username": "admin", "password": "s3cret"}
    warnings = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert str(mount) in warnings[0].getMessage()

    publish(mount, {"username": "back", "password": "again"}, version=3)
    assert dict(credentials.current()) == {"username": "back", "password": "again"}


def test_refresh_rereads_even_when_the_version_did_not_change(mount: Path) -> None:
    credentials = MountedSecretCredentials(mount)
    credentials.current()
    # Not what the kubelet does, but an operator editing the live version folder would:
    (mount / os.readlink(mount / "..data") / "password").write_text("edited")

    assert credentials.current()["password"] == "s3cret"  # the cheap check saw no swap
    assert credentials.refresh()["password"] == "edited"
    assert credentials.current()["password"] == "edited"


def test_a_plain_directory_without_data_link_works_and_notices_replaced_files(
    tmp_path: Path,
) -> None:
    (tmp_path / "username").write_text("admin\n")
    (tmp_path / "password").write_text("one")
    (tmp_path / ".hidden").write_text("not a key")
    (tmp_path / "nested").mkdir()
    credentials = MountedSecretCredentials(tmp_path)
    assert dict(credentials.current()) == {"username": "admin", "password": "one"}

    (tmp_path / "password.new").write_text("two")
    os.replace(tmp_path / "password.new", tmp_path / "password")

    assert dict(credentials.current()) == {"username": "admin", "password": "two"}


def test_a_directory_never_seen_gives_an_empty_set_and_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        values = MountedSecretCredentials(tmp_path / "missing").current()

    assert dict(values) == {}
    assert "keeping the last good set (0 keys)" in caplog.text


def test_a_key_that_is_not_utf8_is_skipped_by_name(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "username").write_text("admin")
    (tmp_path / "keytab").write_bytes(b"\xff\xfe\x00binary")
    with caplog.at_level(logging.WARNING):
        values = MountedSecretCredentials(tmp_path).current()

    assert dict(values) == {"username": "admin"}
    assert "keytab" in caplog.text


def test_no_value_reaches_logs_or_reprs_through_rotation_and_loss(
    mount: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secrets = ["admin", "s3cret", "hunter2-rotated", "after-the-outage"]
    caplog.set_level(logging.DEBUG)
    credentials = MountedSecretCredentials(mount)
    texts = [repr(credentials), str(credentials), repr(credentials.current())]
    publish(mount, {"username": "admin", "password": "hunter2-rotated"}, version=2)
    texts += [repr(credentials.current()), str(credentials.refresh())]
    shutil.rmtree(mount)
    texts.append(repr(credentials.current()))
    publish(mount, {"username": "admin", "password": "after-the-outage"}, version=3)
    values = credentials.current()
    texts += [repr(values), str(values), f"{values}", f"{values!r}"]

    assert values["password"] == "after-the-outage"
    assert "DEBUG" in caplog.text  # debug lines were written, and checked
    for secret in secrets:
        assert secret not in caplog.text
        assert all(secret not in text for text in texts)
    assert "password" in repr(values)  # the keys are shown


def test_the_returned_set_is_read_only_and_compares_like_a_dict() -> None:
    values = SecretValues({"username": "admin"})

    with pytest.raises(TypeError):
        values["username"] = "other"  # type: ignore[index]
    assert values == {"username": "admin"}
    assert repr(values) == "SecretValues(keys=['username'])"
