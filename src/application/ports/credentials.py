"""Where hypervisor credentials come from (a mounted Secret, the Kubernetes API, env)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class Credentials(Protocol):
    """Safe to call from many threads; a returned set is read-only and its repr shows keys only.

    Neither method raises when the source is unreachable: the last good set is returned (empty
    if none was ever read) and the adapter logs a warning, so a login fails on a missing key
    rather than on an I/O error.
    """

    def current(self) -> Mapping[str, str]:
        """The newest complete set of key -> value (values whitespace-trimmed); cheap per call."""
        ...

    def refresh(self) -> Mapping[str, str]:
        """Re-read now (after an authentication failure) and return the result."""
        ...
