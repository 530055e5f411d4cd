"""The skip policy (support.skip_policy) in a pytest run of its own: in CI a skip the allow-list
does not name fails the run, every run lists its skip reasons, and the allow-list never lets CI
skip what scripts/test sets up (root, namespaces, the real libvirtd + QEMU)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.qemu_wanted import QEMU_NOT_WANTED
from support.skip_policy import ALLOW_LIST, load_allowed

TESTS = Path(__file__).parents[1]
ONE_SKIP = """
import pytest

def test_runs():
    assert True

def test_skips():
    pytest.skip("no frobnicator here")
"""
ALLOWING = """
[[skip]]
reason = "no frob.* here"
why = "the frobnicator is optional"
"""


def run_pytest(
    tmp_path: Path, *, ci: bool, allow_list: str = ""
) -> subprocess.CompletedProcess[str]:
    """A session on one module that passes one test and skips another."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_one_skip.py").write_text(ONE_SKIP)
    (tmp_path / "allowed.toml").write_text(allow_list)
    environ = {key: value for key, value in os.environ.items() if key != "CI"}
    environ["PYTHONPATH"] = os.pathsep.join([str(TESTS), environ.get("PYTHONPATH", "")])
    if ci:
        environ["CI"] = "true"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "support.skip_policy", "-p", "no:cacheprovider",
         "--allowed-skips", str(tmp_path / "allowed.toml"), str(tmp_path)],
        cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_a_ci_run_where_a_test_skips_for_an_unlisted_reason_fails(tmp_path: Path) -> None:
    ran = run_pytest(tmp_path, ci=True)
    assert ran.returncode == pytest.ExitCode.TESTS_FAILED, ran.stdout
    assert "1  no frobnicator here  (not allowed in CI)" in ran.stdout
    assert "CI=true: 1 skipped test(s) with a reason" in ran.stdout


def test_outside_ci_the_same_run_passes_and_lists_the_reason(tmp_path: Path) -> None:
    ran = run_pytest(tmp_path, ci=False)
    assert ran.returncode == pytest.ExitCode.OK, ran.stdout
    assert "skip reasons" in ran.stdout
    assert "1  no frobnicator here  (not allowed in CI)" in ran.stdout


def test_a_ci_run_passes_when_the_reason_is_listed_and_says_why(tmp_path: Path) -> None:
    ran = run_pytest(tmp_path, ci=True, allow_list=ALLOWING)
    assert ran.returncode == pytest.ExitCode.OK, ran.stdout
    assert "1  no frobnicator here  (allowed: the frobnicator is optional)" in ran.stdout


def test_an_entry_without_why_is_refused(tmp_path: Path) -> None:
    ran = run_pytest(tmp_path, ci=False, allow_list='[[skip]]\nreason = "no frob.* here"\n')
    assert ran.returncode == pytest.ExitCode.USAGE_ERROR, ran.stdout + ran.stderr
    assert "needs a reason and a why" in ran.stderr


@pytest.mark.parametrize(
    "reason",
    [
        QEMU_NOT_WANTED,
        "needs root: a tmpfs in a mount namespace of its own",
        "needs root: buildah, podman and nsenter",
    ],
)
def test_the_allow_list_lets_no_ci_run_skip_what_scripts_test_sets_up(reason: str) -> None:
    assert not [entry.why for entry in load_allowed(ALLOW_LIST) if entry.reason.fullmatch(reason)]
