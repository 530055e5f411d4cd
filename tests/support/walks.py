"""The walks docs/architecture.md draws, counted: the deepest chain of the project's own frames
a request runs through, from the gRPC edge (or the task's thread) to the call that answers it.

A frame is one call of a function of the package (a lambda included; the generated gRPC stubs
and comprehensions not); the chain is read at every call while a request is recorded, in every
thread, and the deepest one that starts in a gRPC worker is kept. Library frames between two
of the project's (returns' `bind`, grpcio's handler) are not counted: the count measures how
many of our own rooms a request is passed through, which is what a newcomer reads.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import pyrigaud

PACKAGE = str(Path(pyrigaud.__file__).parent)
GENERATED = f"{PACKAGE}/entrypoints/grpc/generated/"
# A request's chain starts in a gRPC worker; the provider's background threads (the domain
# cache's refresh, the inventory feed) run meanwhile but are no part of it.
REQUEST_ROOT = "entrypoints/grpc/workers:RpcWorkers._work"
# The rooms a request passes through, outermost first (the domain's frames are no step).
_ROOM_ORDER = {"entrypoints": 0, "application": 1, "adapters": 2}
# Python 3.12 inlines comprehensions: they are not frames a reader passes through.
COMPREHENSIONS = frozenset({"<genexpr>", "<listcomp>", "<dictcomp>", "<setcomp>"})


def _frame_name(frame: FrameType) -> str:
    module = frame.f_code.co_filename[len(PACKAGE) + 1 : -len(".py")]
    return f"{module}:{frame.f_code.co_qualname}"


def _project_chain(frame: FrameType | None) -> list[str]:
    """The project's frames on this stack, outermost first."""
    chain: list[str] = []
    while frame is not None:
        filename = frame.f_code.co_filename
        if (
            filename.startswith(PACKAGE)
            and not filename.startswith(GENERATED)
            and frame.f_code.co_name not in COMPREHENSIONS
        ):
            chain.append(_frame_name(frame))
        frame = frame.f_back
    chain.reverse()
    return chain


@dataclass
class Walk:
    """The deepest chain seen while recording: `frames`, outermost first."""

    frames: list[str] = field(default_factory=list)

    @property
    def depth(self) -> int:
        return len(self.frames)

    def drawn(self) -> str:
        return "\n".join(f"{index:3d}  {name}" for index, name in enumerate(self.frames, 1))

    @property
    def rooms_reentered(self) -> list[str]:
        """The frames where the chain steps back into an outer room it had left (the edge,
        then the application, then the adapters: a request goes inward only). The domain's
        frames are no step: pure code any room calls, and a stream it holds pulls its
        source's chunks wherever they are made."""
        reentered, deepest = [], 0
        for name in self.frames:
            room = _ROOM_ORDER.get(name.split("/", 1)[0])
            if room is None:
                continue
            if room < deepest:
                reentered.append(name)
            deepest = max(deepest, room)
        return reentered


class WalkRecorder:
    """Installed before the server starts (threads take the profile hook when they start), it
    records only inside `recording()`, so setting the provider up costs a flag test per call."""

    def __init__(self) -> None:
        self._walk: Walk | None = None
        self._lock = threading.Lock()

    def _hook(self, frame: FrameType, event: str, _argument: Any) -> None:
        walk = self._walk
        if walk is None or event != "call":
            return
        chain = _project_chain(frame)
        if len(chain) > walk.depth and chain[0] == REQUEST_ROOT:
            with self._lock:
                if len(chain) > walk.depth:
                    walk.frames = chain

    @contextmanager
    def installed(self) -> Iterator[WalkRecorder]:
        threading.setprofile(self._hook)
        sys.setprofile(self._hook)
        try:
            yield self
        finally:
            sys.setprofile(None)
            threading.setprofile(None)

    @contextmanager
    def recording(self) -> Iterator[Walk]:
        walk = Walk()
        self._walk = walk
        try:
            yield walk
        finally:
            self._walk = None
