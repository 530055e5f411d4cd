"""No silent skips: every run ends with its skip reasons and their counts, and in CI
(`CI=true`) a skip whose reason the allow-list does not name fails the run.

The allow-list (tests/allowed_skips.toml, or `--allowed-skips`) holds `[[skip]]` entries, each
a `reason` (a regular expression the whole skip reason must match) and `why` that skip may
stand. Outside CI nothing fails: a developer's run without root or without QEMU shows what it
skipped and why, and a CI run, which has both, must skip nothing that is not listed.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

ALLOW_LIST = Path(__file__).parents[1] / "allowed_skips.toml"
SECTION = "skip reasons"


@dataclass(frozen=True)
class AllowedSkip:
    reason: re.Pattern[str]
    why: str


def load_allowed(path: Path) -> list[AllowedSkip]:
    """The allow-list's entries; one without both a reason and a why is an error."""
    entries = tomllib.loads(path.read_text()).get("skip", [])
    allowed = []
    for entry in entries:
        if not entry.get("reason") or not entry.get("why"):
            raise pytest.UsageError(f"{path}: every [[skip]] needs a reason and a why: {entry}")
        allowed.append(AllowedSkip(re.compile(entry["reason"]), entry["why"]))
    return allowed


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1"}


def skip_reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    """The reason a skip was given, without pytest's "Skipped: " prefix."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


class SkipPolicy:
    """Counts the skips of a session by reason; in CI, an unlisted one fails the session."""

    def __init__(self, allow_list: Path, enforced: bool) -> None:
        self.allow_list = allow_list
        self.allowed = load_allowed(allow_list)
        self.enforced = enforced
        self.reasons: Counter[str] = Counter()

    def why_allowed(self, reason: str) -> str | None:
        return next((entry.why for entry in self.allowed if entry.reason.fullmatch(reason)), None)

    def unallowed(self) -> list[str]:
        return [reason for reason in self.reasons if self.why_allowed(reason) is None]

    def _count(self, report: pytest.CollectReport | pytest.TestReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):  # an xfail is not a skip
            self.reasons[skip_reason(report)] += 1

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._count(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._count(report)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.enforced and self.unallowed() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        terminalreporter.section(SECTION)
        if not self.reasons:
            terminalreporter.line("none: no test skipped")
            return
        for reason, count in self.reasons.most_common():
            why = self.why_allowed(reason)
            verdict = f"allowed: {why}" if why is not None else "not allowed in CI"
            terminalreporter.line(f"{count:5d}  {reason}  ({verdict})")
        if self.enforced and self.unallowed():
            terminalreporter.line(
                f"CI=true: {sum(self.reasons[r] for r in self.unallowed())} skipped test(s) "
                f"with a reason {self.allow_list} does not allow: the run fails",
                red=True,
                bold=True,
            )


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--allowed-skips",
        type=Path,
        default=ALLOW_LIST,
        help="the skips a CI run (CI=true) may show, with why (default: tests/allowed_skips.toml)",
    )


def pytest_configure(config: pytest.Config) -> None:
    policy = SkipPolicy(config.getoption("--allowed-skips"), enforced=in_ci())
    config.pluginmanager.register(policy, "skip-policy")
