"""Process-wide logging, configured once at start-up from LOG_LEVEL and LOG_FORMAT.

With LOG_FORMAT=json every line the process writes to stderr must be one JSON object, so a log
collector never has to stitch lines together. Python's own output is easy (handlers and hooks);
the gRPC C-core writes straight to file descriptor 2, so in json mode fd 2 becomes a pipe whose
reader thread wraps each foreign line in a JSON object before it reaches the real stderr.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from types import TracebackType

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
_FORMATS = ("text", "json")

# Everything a bare LogRecord carries (per Python version), plus what Formatter.format adds:
# any other attribute came from `extra=` and is logged as a field.
_RECORD_ATTRS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}

# absl / gRPC C-core prefix, e.g. "E1202 12:00:00.000000  123 file.cc:1] ...".
_ABSL_PREFIX = re.compile(r"([IWEF])\d{4} \d{2}:\d{2}:\d{2}\.\d+\s")
_ABSL_LEVELS = {"I": "info", "W": "warning", "E": "error", "F": "critical"}

_BARE_VALUE = re.compile(r'[^\s"=]+')
_READ_CHUNK = 65536
# A "line" with no newline is cut here, so a runaway writer cannot grow the buffer without bound.
_MAX_LINE = 65536
# At exit, how long to wait for the reader to drain: a child process that inherited fd 2 keeps
# the pipe open, and exit must not hang on it.
_DRAIN_TIMEOUT_S = 2.0
# Before giving fd 2 back, wait until nothing has arrived for this long: the gRPC core's own
# threads still log while a channel or server shuts down, after Python's main has returned.
_QUIET_S = 0.05

_log = logging.getLogger(__name__)


def configure_logging(level: str | None, fmt: str | None) -> None:
    """Install handlers per LOG_LEVEL/LOG_FORMAT values (the caller passes the raw env values).

    Unset or empty values mean info and text; unknown values fall back to those with one
    warning each. Safe to call again: handlers are replaced, and fd 2 is redirected at most once
    (kept while the format stays json, given back when it changes to text).
    """
    level_key = (level or "").strip().lower() or "info"
    fmt_key = (fmt or "").strip().lower() or "text"
    complaints = []
    if level_key not in _LEVELS:
        complaints.append(
            f"unknown LOG_LEVEL {level!r}, using info (expected debug, info, warn or error)"
        )
    if fmt_key not in _FORMATS:
        complaints.append(f"unknown LOG_FORMAT {fmt!r}, using text (expected text or json)")

    if _state.pipe is not None and fmt_key != "json":
        atexit.unregister(_state.pipe.close)
        _state.pipe.close()
        _state.pipe = None

    handler: logging.Handler
    if fmt_key == "json":
        if _state.pipe is None:
            _state.pipe = _StderrPipe()
            atexit.register(_state.pipe.close)
        handler = _FdHandler(_state.pipe.writer)
        handler.setFormatter(JsonFormatter())
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(TextFormatter())

    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(_LEVELS.get(level_key, logging.INFO))

    logging.captureWarnings(True)
    sys.excepthook = _log_uncaught
    threading.excepthook = _log_uncaught_in_thread
    sys.unraisablehook = _log_unraisable

    for complaint in complaints:
        _log.warning(complaint)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: ts, level, logger, msg, exception, extras."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": _iso_utc(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": _message(record),
        }
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        for key, value in _extras(record):
            # The fixed keys win: a clashing extra is kept, under a prefixed name.
            out[f"extra_{key}" if key in out else key] = value
        try:
            return json.dumps(out, default=str, allow_nan=False)
        except (TypeError, ValueError):
            # NaN, a circular value or a non-string dict key: the line still has to go out.
            return json.dumps({key: _jsonable(value) for key, value in out.items()}, default=str)


class TextFormatter(logging.Formatter):
    """`2026-12-02T12:00:00.123Z INFO logger: message key=value ...` for people at a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_iso_utc(record.created)} {record.levelname} {record.name}: {_message(record)}"
        line += "".join(f" {key}={_logfmt_value(value)}" for key, value in _extras(record))
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line += "\n" + record.exc_text
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


def _message(record: logging.LogRecord) -> str:
    # Captured warnings (warnings.formatwarning) end in a newline; a log line should not.
    return record.getMessage().rstrip("\n")


def _extras(record: logging.LogRecord) -> Iterator[tuple[str, object]]:
    return ((k, v) for k, v in vars(record).items() if k not in _RECORD_ATTRS)


def _jsonable(value: object) -> object:
    try:
        json.dumps(value, default=str, allow_nan=False)
    except (TypeError, ValueError):
        return str(value)
    return value


def _logfmt_value(value: object) -> str:
    text = str(value)
    return text if _BARE_VALUE.fullmatch(text) else json.dumps(text)


def _iso_utc(seconds: float) -> str:
    whole, millis = divmod(int(seconds * 1000), 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{millis:03d}Z"


def _stderr_line_as_json(text: str) -> str:
    """A line someone wrote to fd 2, as a JSON object (passed through if it already is one)."""
    if text.startswith("{"):
        with contextlib.suppress(ValueError, RecursionError):
            if isinstance(json.loads(text), dict):
                return text
    absl = _ABSL_PREFIX.match(text)
    return json.dumps(
        {
            "ts": _iso_utc(time.time()),
            "level": _ABSL_LEVELS[absl[1]] if absl else "info",
            # Not absl-shaped: a print to sys.stderr, a C library, a child process.
            "logger": "grpc.core" if absl else "stderr",
            "msg": text,
        }
    )


class _FdWriter:
    """Whole-line writes to one fd, serialised so log records and wrapped lines never interleave."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._lock = threading.Lock()

    def write_line(self, line: str) -> None:
        data = memoryview(line.encode("utf-8", "backslashreplace") + b"\n")
        with self._lock:
            while data:
                data = data[os.write(self.fd, data) :]

    def retarget(self, fd: int) -> int:
        """Write to `fd` from now on; returns the old fd, which no write uses any more."""
        with self._lock:
            old, self.fd = self.fd, fd
        return old


class _FdHandler(logging.Handler):
    """Writes records to the real stderr fd, so they skip the fd 2 pipe and are not re-wrapped."""

    def __init__(self, writer: _FdWriter) -> None:
        super().__init__()
        self._writer = writer

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._writer.write_line(self.format(record))
        except Exception:
            self.handleError(record)


class _StderrPipe:
    """fd 2 redirected into a pipe; a daemon thread turns each line into JSON on the real stderr."""

    def __init__(self) -> None:
        self.writer = _FdWriter(os.dup(2))
        self._last_input = time.monotonic()
        read_fd, write_fd = os.pipe()
        sys.stderr.flush()
        os.dup2(write_fd, 2)
        os.close(write_fd)
        self._reader = threading.Thread(
            target=self._pump, args=(read_fd,), name="stderr-to-json", daemon=True
        )
        self._reader.start()

    def close(self) -> None:
        """Give fd 2 back to the real stderr once writers have gone quiet, and drain the pipe.

        Restoring fd 2 drops the pipe's last write end (unless a child process inherited it), so
        the reader sees end-of-file after the last byte. Python's records keep going out as JSON
        through fd 2; only raw writes made after this point are no longer wrapped.
        """
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        start = time.monotonic()
        deadline = start + _DRAIN_TIMEOUT_S
        while time.monotonic() < deadline:
            if time.monotonic() - max(start, self._last_input) >= _QUIET_S:
                break
            time.sleep(_QUIET_S / 5)
        os.dup2(self.writer.fd, 2)
        self._reader.join(timeout=max(deadline - time.monotonic(), 0.0))
        os.close(self.writer.retarget(2))

    def _pump(self, read_fd: int) -> None:
        pending = b""
        try:
            while chunk := os.read(read_fd, _READ_CHUNK):
                self._last_input = time.monotonic()
                *lines, pending = (pending + chunk).split(b"\n")
                if len(pending) >= _MAX_LINE:
                    lines.append(pending)
                    pending = b""
                for line in lines:
                    self._forward(line)
            self._forward(pending)
        finally:
            os.close(read_fd)

    def _forward(self, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace").rstrip("\r")
        if not text.strip():
            return
        # Nowhere left to report a failing stderr; the pipe must keep draining, or every
        # writer to fd 2 (the gRPC core included) blocks once it fills.
        with contextlib.suppress(OSError):
            self.writer.write_line(_stderr_line_as_json(text))


class _State:
    """What configure_logging installed last, so a second call can undo it."""

    pipe: _StderrPipe | None = None


_state = _State()


def _log_uncaught(
    exc_type: type[BaseException], exc_value: BaseException, tb: TracebackType | None
) -> None:
    _log.critical("uncaught exception", exc_info=(exc_type, exc_value, tb))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:  # threading's own hook is silent about it too
        return
    name = args.thread.name if args.thread is not None else "?"
    _log.error("uncaught exception in thread %s", name, exc_info=args.exc_value)


def _log_unraisable(args: sys.UnraisableHookArgs) -> None:
    where = args.err_msg or "Exception ignored in"
    if args.object is not None:
        try:
            where = f"{where}: {args.object!r}"
        except Exception:
            where = f"{where}: <object repr() failed>"
    _log.error("%s", where, exc_info=args.exc_value)
