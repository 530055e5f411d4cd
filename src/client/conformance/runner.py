"""Run the clauses in order, with a progress line, and always clean up the run's VMs."""

from __future__ import annotations

import enum
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pyrigaud.client.conformance.catalogue import Clause
from pyrigaud.client.conformance.session import (
    ContractBreachError,
    NotApplicableError,
    RpcRefusedError,
    Session,
)


class Outcome(enum.Enum):
    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"
    NOT_RUN = "not run"  # interrupted before it started


@dataclass(frozen=True)
class Result:
    key: str
    title: str
    outcome: Outcome
    seconds: float
    reason: str = ""


@dataclass(frozen=True)
class Report:
    endpoint: str
    results: tuple[Result, ...]
    cleanup_problems: tuple[str, ...]
    interrupted: bool
    left: tuple[str, ...] = ()  # what the run made and no RPC removes (not a failure)

    @property
    def ok(self) -> bool:
        """Every required clause passed (a skip is only ever an unclaimed feature)."""
        return (
            not self.interrupted
            and not self.cleanup_problems
            and all(result.outcome in (Outcome.PASSED, Outcome.SKIPPED) for result in self.results)
        )


Progress = Callable[[int, int, Clause, Result | None], None]


def run_clause(clause: Clause, session: Session) -> Result:
    started = time.monotonic()
    outcome, reason = Outcome.PASSED, ""
    try:
        clause.check(session)
    except NotApplicableError as skipped:
        outcome, reason = Outcome.SKIPPED, str(skipped)
    except (ContractBreachError, RpcRefusedError) as failed:
        outcome, reason = Outcome.FAILED, str(failed)
    return Result(clause.key, clause.title, outcome, time.monotonic() - started, reason)


def run(endpoint: str, clauses: Sequence[Clause], session: Session, progress: Progress) -> Report:
    """Every clause, then the cleanup: also after a failure or Ctrl-C (KeyboardInterrupt)."""
    results: list[Result] = []
    interrupted = False
    try:
        for index, clause in enumerate(clauses):
            progress(index, len(clauses), clause, None)
            results.append(run_clause(clause, session))
            progress(index, len(clauses), clause, results[-1])
    except KeyboardInterrupt:
        interrupted = True
        done = {result.key for result in results}
        results.extend(
            Result(c.key, c.title, Outcome.NOT_RUN, 0.0, "interrupted")
            for c in clauses
            if c.key not in done
        )
    finally:
        problems = tuple(_uninterruptible(session.cleanup))
    return Report(endpoint, tuple(results), problems, interrupted, tuple(session.left))


def _uninterruptible(cleanup: Callable[[], list[str]]) -> list[str]:
    """A second Ctrl-C must not leave VMs behind: the cleanup runs to its end."""
    if threading.current_thread() is not threading.main_thread():
        return cleanup()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return cleanup()
    finally:
        signal.signal(signal.SIGINT, previous)
