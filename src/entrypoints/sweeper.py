"""Runs the leftover sweep at start-up and then periodically, off the request path.

At start-up because a restarted process may have been killed mid-Create; periodically because
a replica killed for good is never restarted, and its leftovers would otherwise wait for the
next Create or Delete of the same name.
"""

from __future__ import annotations

import logging
import threading

from returns.result import Failure, Success

from pyrigaud.application.use_cases.sweep_leftovers import SweepLeftovers

logger = logging.getLogger("pyrigaud.sweep")


class LeftoverSweeper:
    def __init__(self, sweep: SweepLeftovers, interval_seconds: float) -> None:
        self._sweep = sweep
        self._interval = interval_seconds
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leftover-sweep", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()

    def sweep_once(self) -> None:
        """One pass; never raises, so a bug here cannot take the service down with it."""
        try:
            result = self._sweep()
        except Exception:
            logger.exception("leftover sweep failed")
            return
        match result:
            case Failure(error):
                logger.warning("leftover sweep could not list unfinished VMs: %s", error)
            case Success(report):
                for name in report.removed:
                    logger.info(
                        "removed the leftover of a Create or an import killed part-way: VM %r", name
                    )
                for name in report.removed_transfer_volumes:
                    logger.info("removed the temporary volume of a dead transfer: %r", name)
                if report.removed_staged:
                    logger.info(
                        "removed %d staged temporaries of dead transfers and hardware manifests "
                        "whose disk is gone",
                        report.removed_staged,
                    )
                for failure in report.failures:
                    logger.warning("could not remove a leftover: %s", failure)

    def _run(self) -> None:
        while True:
            self.sweep_once()
            if self._stopping.wait(self._interval):
                return
