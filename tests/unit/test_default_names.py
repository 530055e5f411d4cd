"""The names the domain gives what a request leaves unnamed, and the guest addresses it shows."""

from __future__ import annotations

import pytest

from pyrigaud.domain.addresses import nic_addresses, routable_addresses
from pyrigaud.domain.bounds import name_problem
from pyrigaud.domain.default_names import image_name, imported_disk_name, snapshot_name
from pyrigaud.domain.models import ImageSource

GUEST = ("127.0.0.1", "::1", "fe80::5054:ff:fe00:1%eth0", "198.51.100.7", "198.51.100.7", "x")


def test_the_guest_addresses_shown_are_the_routable_ones_once_each_in_order() -> None:
    assert routable_addresses(GUEST) == ("198.51.100.7",)
    assert routable_addresses(("2001:db8::1/64", "192.0.2.5")) == ("2001:db8::1", "192.0.2.5")


def test_nics_take_the_shown_addresses_by_position_and_none_past_the_last() -> None:
    assert nic_addresses((*GUEST, "192.0.2.5"), 3) == ("198.51.100.7", "192.0.2.5", "")
    assert nic_addresses(GUEST, 0) == ()


def test_a_snapshot_is_named_for_when_it_is_taken_in_utc() -> None:
    assert snapshot_name(1_800_000_000) == "snapshot-20270115-080000"


@pytest.mark.parametrize(
    ("source", "stem"),
    [
        (ImageSource(url="https://images.example/jammy.qcow2?x=1"), "jammy.qcow2-x-1-"),
        (ImageSource(template_name="ubuntu-22.04"), "ubuntu-22.04-"),
        (ImageSource(path="/var/lib/images/"), "images-"),
        (ImageSource(url="https://h/%%%"), "image-"),
    ],
)
def test_an_image_is_named_from_its_source_the_same_each_time(
    source: ImageSource, stem: str
) -> None:
    name = image_name(source)
    assert name.startswith(stem)
    assert name == image_name(source.model_copy())
    assert name_problem(name) is None


def test_an_imported_disk_is_named_as_the_staged_object_without_its_format() -> None:
    assert imported_disk_name("web-01.qcow2") == "web-01"
    assert imported_disk_name("web-01.img") == "web-01"
    assert imported_disk_name("web-01.disk") == "web-01.disk"
