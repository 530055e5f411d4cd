"""The image URL rules: what a spec's URL may make the provider connect to."""

from __future__ import annotations

import pytest
from returns.result import Success

from pyrigaud.domain.errors import ErrorKind
from pyrigaud.domain.image_urls import (
    ImageURL,
    address_problem,
    parse_image_url,
)

from support import error_of


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://169.254.169.254/latest/meta-data/", "metadata"),
        ("http://[fd00:ec2::254]/latest/", "metadata"),
        ("http://[::ffff:169.254.169.254]/", "metadata"),
        ("http://169.254.10.20/image.qcow2", "link-local"),
        ("http://[fe80::1]/image.qcow2", "link-local"),
        ("http://metadata.google.internal/computeMetadata/v1/", "metadata"),
        ("http://METADATA.google.internal./x", "metadata"),
        ("http://0.0.0.0/image.qcow2", "not a host address"),
        ("ftp://10.0.0.1/image.qcow2", "only http and https"),
        ("file:///etc/passwd", "only http and https"),
        ("http://user:secret@10.0.0.1/image.qcow2", "credentials"),
        ("http:///image.qcow2", "names no host"),
        ("http://10.0.0.1:99999/image.qcow2", "not a valid URL"),
    ],
)
def test_refused_urls_say_why(url: str, reason: str) -> None:
    error = error_of(parse_image_url(url, "source.url"))
    assert error.kind is ErrorKind.INVALID_SPEC
    assert error.message.startswith("source.url: ")
    assert reason in error.message


def test_an_allowed_url_is_split_for_the_request_line() -> None:
    assert parse_image_url("https://[2001:db8::5]:8443/a/b.qcow2?sig=1", "url") == Success(
        ImageURL(scheme="https", host="2001:db8::5", port=8443, target="/a/b.qcow2?sig=1")
    )
    assert parse_image_url("HTTP://mirror.internal/x.img", "url").map(
        lambda split: split.port
    ) == Success(80)


@pytest.mark.parametrize("address", ["127.0.0.1", "127.8.9.10", "::1"])
def test_loopback_is_refused_unless_allowed(address: str) -> None:
    problem = address_problem(address, allow_loopback=False)
    assert problem is not None
    assert "PYRIGAUD_IMAGE_URL_ALLOW_LOOPBACK" in problem
    assert address_problem(address, allow_loopback=True) is None


@pytest.mark.parametrize(
    "address", ["169.254.169.254", "169.254.0.1", "fe80::abcd", "fd00:ec2::254"]
)
def test_link_local_and_metadata_are_refused_even_when_loopback_is_allowed(address: str) -> None:
    assert address_problem(address, allow_loopback=True) is not None


@pytest.mark.parametrize(
    "address", ["10.1.2.3", "172.16.0.9", "192.168.1.50", "fd12::7", "203.0.113.8"]
)
def test_private_and_public_ranges_are_allowed_for_mirrors(address: str) -> None:
    assert address_problem(address, allow_loopback=False) is None


def test_text_that_is_no_address_is_a_problem() -> None:
    assert address_problem("mirror.internal", allow_loopback=True) == (
        "'mirror.internal' is not an IP address"
    )
