"""What an operator sees of the calls into the hypervisor: each port method call counted by
outcome and timed, the operations shown from the start."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol


class CallMetrics(Protocol):
    def record_hypervisor_call(self, operation: str, outcome: str, seconds: float) -> None:
        """One call of `operation` ended: "ok" or the error kind, after `seconds`."""
        ...

    def expect_hypervisor_calls(self, operations: Iterable[str]) -> None:
        """Each of `operations` is counted (at 0) before its first call."""
        ...
