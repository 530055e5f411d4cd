"""Fixtures of the end-to-end suite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from e2e_support import RunningProvider, start_provider


@pytest.fixture
def provider() -> Iterator[RunningProvider]:
    running = start_provider()
    yield running
    running.channel.close()
    running.server.stop(0)
