"""An earlier release of pyrigaud (a revision of this repository) installed in a venv of its own,
so that a test can serve a hypervisor with it and then with the code under test.

The venv is built once per revision and Python version under PYRIGAUD_RELEASE_CACHE
(/var/tmp/pyrigaud-upgrade by default) and reused afterwards: the revision's tree is taken with
`git archive`, built as a wheel without its dependencies, and the wheel installed with the
extras the tests need (their dependencies come from PyPI). A lock file keeps two test sessions
from building one venv at the same time; a venv whose install did not finish is built again.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("PYRIGAUD_RELEASE_CACHE", "/var/tmp/pyrigaud-upgrade"))
EXTRAS = "[vsphere,s3]"
BUILD_SECONDS = 900


def release_command(revision: str) -> list[str]:
    """The command line of `pyrigaud` as released at `revision` (a commit-ish of this repo)."""
    return [str(release_python(revision)), "-m", "pyrigaud.entrypoints.cli"]


def release_python(revision: str) -> Path:
    """The interpreter of the venv holding pyrigaud at `revision`, built on first use."""
    commit = _commit(revision)
    home = CACHE / f"{commit[:12]}-py{sys.version_info.major}.{sys.version_info.minor}"
    venv = home / "venv"
    finished = home / "installed"  # written last: its presence means the venv is whole
    home.mkdir(parents=True, exist_ok=True)
    with (home / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not finished.exists():
            shutil.rmtree(venv, ignore_errors=True)
            _build(commit, venv)
            finished.write_text(commit + "\n")
    return venv / "bin" / "python"


def _commit(revision: str) -> str:
    found = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if found.returncode != 0:
        raise AssertionError(
            f"revision {revision} is not in this clone (a shallow clone?): "
            "`git fetch --unshallow` brings the history the upgrade test installs from"
        )
    return found.stdout.strip()


def _build(commit: str, venv: Path) -> None:
    """A venv at `venv` with the wheel of `commit`'s tree and the extras' dependencies."""
    with tempfile.TemporaryDirectory(prefix="pyrigaud-release-") as scratch:
        tree, wheels = Path(scratch, "tree"), Path(scratch, "wheels")
        tree.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", "--format=tar", commit],
            capture_output=True,
            check=True,
        )
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
        _run(sys.executable, "-m", "venv", str(venv))
        python = str(venv / "bin" / "python")
        pip = [python, "-m", "pip", "--disable-pip-version-check", "-q"]
        _run(*pip, "wheel", "--no-deps", "--wheel-dir", str(wheels), str(tree))
        (wheel,) = wheels.glob("pyrigaud-*.whl")
        _run(*pip, "install", f"{wheel}{EXTRAS}")


def _run(*command: str) -> None:
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=BUILD_SECONDS, check=False
    )
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed: {done.stderr[-4000:]}")
