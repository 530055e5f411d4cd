"""The package list in pyproject.toml names every folder of src/ (the finder cannot)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_source_package_is_installed() -> None:
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    on_disk = {
        ".".join(("pyrigaud", *init.parent.relative_to(ROOT / "src").parts))
        for init in (ROOT / "src").rglob("__init__.py")
    }
    assert on_disk == listed
