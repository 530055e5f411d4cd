"""Health and capabilities, on every backend; a lacked port is never claimed."""

from __future__ import annotations

from pyrigaud.domain.models import Capabilities

from contract.harness import Harness


def claimed_ports(capabilities: Capabilities) -> dict[str, bool]:
    """Which optional port each capability flag promises."""
    return {
        "snapshots": capabilities.supports_snapshots,
        "cloning": capabilities.supports_clone,
        "images": capabilities.supports_image_import,
        "disk_transfer": capabilities.supports_disk_export or capabilities.supports_disk_import,
    }


def test_health_and_capabilities_answer(harness: Harness) -> None:
    assert harness.backend.health.check().ok
    capabilities = harness.backend.capabilities.capabilities()
    assert capabilities.supports_snapshots or not capabilities.supports_memory_snapshots


def test_every_claimed_feature_has_its_port(harness: Harness) -> None:
    claimed = claimed_ports(harness.backend.capabilities.capabilities())
    for port, promised in claimed.items():
        if promised:
            assert getattr(harness.backend, port) is not None, f"claims {port} without the port"
