"""The NoCloud seed ISO, read back with pycdlib as cloud-init's blkid/mount would see it."""

from __future__ import annotations

import io
import json

import pycdlib
import pytest

from pyrigaud.adapters.hypervisors.libvirt.cloud_init import (
    SeedInput,
    build_seed,
    needs_seed,
)
from pyrigaud.domain.models import NetworkAttachment


def read_seed(iso_bytes: bytes) -> tuple[str, dict[str, bytes]]:
    """The volume id and every file by its Rock Ridge name (checked against the Joliet one)."""
    iso = pycdlib.PyCdlib()
    iso.open_fp(io.BytesIO(iso_bytes))
    try:
        volume_id = iso.pvd.volume_identifier.decode().strip()
        files: dict[str, bytes] = {}
        for child in iso.list_children(rr_path="/"):
            if child.is_dot() or child.is_dotdot():
                continue
            name = child.rock_ridge.name().decode()
            for path_kind in ("rr_path", "joliet_path"):
                out = io.BytesIO()
                iso.get_file_from_iso_fp(out, **{path_kind: f"/{name}"})
                assert files.setdefault(name, out.getvalue()) == out.getvalue()
        return volume_id, files
    finally:
        iso.close()


def test_the_managers_user_and_meta_data_are_carried_verbatim() -> None:
    user_data = b"#cloud-config\npackages: [htop]\n"
    meta_data = b"instance-id: from-manager\nlocal-hostname: web-0\n"
    seed = SeedInput(name="web-0", instance_id="u-1", user_data=user_data, meta_data=meta_data)
    volume_id, files = read_seed(build_seed(seed))
    assert volume_id == "cidata"
    assert files == {"user-data": user_data, "meta-data": meta_data}


def test_without_data_the_seed_has_minimal_user_data_and_generated_meta_data() -> None:
    seed = SeedInput(name="web: 1 #x", instance_id="4b7c1e0e-0000-4000-8000-000000000001")
    _, files = read_seed(build_seed(seed))
    assert files["user-data"] == b"#cloud-config\n"
    # JSON is YAML: the odd name stays a quoted string, not YAML syntax.
    assert json.loads(files["meta-data"]) == {
        "instance-id": "4b7c1e0e-0000-4000-8000-000000000001",
        "local-hostname": "web: 1 #x",
    }


def test_static_addressing_becomes_network_config_v2_matched_by_mac() -> None:
    networks = (
        NetworkAttachment(
            mac_address="52:54:00:AA:BB:01",
            static_ip="10.0.0.5",
            prefix=26,
            gateway="10.0.0.1",
            dns=("10.0.0.53", "1.1.1.1"),
        ),
        NetworkAttachment(mac_address="52:54:00:aa:bb:02", static_ip="2001:db8::5"),
        NetworkAttachment(mac_address="52:54:00:aa:bb:03"),
    )
    seed = SeedInput(name="db", instance_id="i", user_data=b"#cloud-config\n", networks=networks)
    _, files = read_seed(build_seed(seed))
    assert json.loads(files["network-config"]) == {
        "version": 2,
        "ethernets": {
            "nic0": {
                "match": {"macaddress": "52:54:00:aa:bb:01"},
                "addresses": ["10.0.0.5/26"],
                "routes": [{"to": "default", "via": "10.0.0.1"}],
                "nameservers": {"addresses": ["10.0.0.53", "1.1.1.1"]},
            },
            "nic1": {"match": {"macaddress": "52:54:00:aa:bb:02"}, "addresses": ["2001:db8::5/64"]},
            "nic2": {"match": {"macaddress": "52:54:00:aa:bb:03"}, "dhcp4": True},
        },
    }


def test_dhcp_only_nics_get_no_network_config() -> None:
    seed = SeedInput(
        name="a", instance_id="i", networks=(NetworkAttachment(mac_address="52:54:00:00:00:01"),)
    )
    _, files = read_seed(build_seed(seed))
    assert set(files) == {"user-data", "meta-data"}


@pytest.mark.parametrize(
    ("user_data", "meta_data", "networks", "wanted"),
    [
        (b"", b"", (), False),
        (b"", b"", (NetworkAttachment(network_name="lan"),), False),
        (b"#cloud-config\n", b"", (), True),
        (b"", b"instance-id: x\n", (), True),
        (b"", b"", (NetworkAttachment(dns=("10.0.0.53",)),), True),
        (b"", b"", (NetworkAttachment(gateway="10.0.0.1"),), True),
    ],
)
def test_a_seed_is_made_only_when_there_is_something_to_say(
    user_data: bytes, meta_data: bytes, networks: tuple[NetworkAttachment, ...], wanted: bool
) -> None:
    assert needs_seed(user_data, meta_data, networks) is wanted
