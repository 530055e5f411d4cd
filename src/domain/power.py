"""Power operations and the two power states the manager understands."""

from __future__ import annotations

from enum import IntEnum, StrEnum


class PowerOp(IntEnum):
    """Values equal the wire enum provider.v1.PowerOp (UNSPECIFIED=0 is never valid)."""

    ON = 1
    OFF = 2
    REBOOT = 3
    SHUTDOWN_GRACEFUL = 4


class PowerState(StrEnum):
    """Exactly the strings the manager writes into its CRD enum: anything else breaks it."""

    ON = "On"
    OFF = "Off"


DEFAULT_GRACEFUL_TIMEOUT_SECONDS = 60
MAX_GRACEFUL_TIMEOUT_SECONDS = 24 * 3600
