"""Fixtures of the end-to-end suite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from support.e2e import RunningProvider, start_provider


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[RunningProvider]:
    """The fake provider, with PVC `mig` mounted for its disk transfers."""
    (tmp_path / "mig").mkdir()
    running = start_provider({"PYRIGAUD_MIGRATION_STORAGE_ROOT": str(tmp_path)})
    yield running
    running.channel.close()
    running.application.stop(0)
