"""The documentation site: its strict build refuses what would rot unseen (the test command
relies on that), and the configuration page names every setting `pyrigaud serve` reads."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pyrigaud.entrypoints.settings import known_setting_names

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A copy of the site's sources, to break."""
    shutil.copy(ROOT / "mkdocs.yml", tmp_path)
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    return tmp_path


def _strict_build(site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site / "out")],
        cwd=site,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("breakage", "complaint"),
    [
        ("[a page](no-such-page.md)", "not found among documentation files"),
        ("[an anchor](configuration.md#no-such-heading)", "does not contain an anchor"),
        ("[source](../src/entrypoints/settings.py)", "not found among documentation files"),
    ],
)
def test_a_broken_link_fails_the_strict_build(site: Path, breakage: str, complaint: str) -> None:
    index = site / "docs" / "index.md"
    index.write_text(index.read_text() + f"\nSee {breakage}.\n")
    built = _strict_build(site)
    assert built.returncode != 0
    assert complaint in built.stderr


def test_a_page_left_out_of_the_nav_fails_the_strict_build(site: Path) -> None:
    (site / "docs" / "orphan.md").write_text("# Orphan\n")
    built = _strict_build(site)
    assert built.returncode != 0
    assert "orphan.md" in built.stderr


def test_every_setting_is_on_the_configuration_page() -> None:
    """The common settings and every registered hypervisor's own."""
    page = (ROOT / "docs" / "configuration.md").read_text()
    documented = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", page))
    assert known_setting_names() - documented == set()
