"""configure_logging, observed from outside: each test runs a fresh Python process and reads its
stderr, because what is under test (fd 2, excepthooks, exit-time draining) is process-wide."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

CORE_LINE = "E1202 12:00:00.000000  123 some_core.cc:1] core said something"

PREAMBLE = """\
import logging, os, sys, threading, warnings
from pyrigaud.entrypoints.logs import configure_logging
configure_logging(os.environ.get("LOG_LEVEL"), os.environ.get("LOG_FORMAT"))
log = logging.getLogger("demo")
"""

# Every way a line reaches stderr that the issue names, plus unraisable exceptions in __del__
# and bytes that are not UTF-8; ends in an uncaught exception.
EVERYTHING = f"""\
log.debug("debug line")
log.info("rpc", extra={{"rpc_method": "Create", "grpc_code": "OK", "duration_ms": 1.23,
                        "peer": "client-identity"}})
log.warning("first\\nsecond")
log.error("odd extras", extra={{"tags": {{"a"}}, "ratio": float("nan"), "ts": "mine"}})
warnings.warn("careful now", UserWarning)
os.write(2, b"{CORE_LINE}\\n")
os.write(2, b"\\xff\\xfe not utf-8\\n")
print("plain print", file=sys.stderr)

class Broken:
    def __del__(self):
        raise KeyError("in __del__")

Broken()
worker = threading.Thread(target=lambda: 1 / 0, name="worker")
worker.start()
worker.join()
raise RuntimeError("main boom")
"""


def run(body: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LOG_", "GRPC_")) and k.lower() not in {"http_proxy", "https_proxy"}
    }
    return subprocess.run(
        [sys.executable, "-c", PREAMBLE + textwrap.dedent(body)],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def json_lines(stderr: str) -> list[dict[str, object]]:
    """Every non-empty line, parsed; fails on any line that is not a complete log object."""
    objects = []
    for line in stderr.splitlines():
        if not line.strip():
            continue
        obj = json.loads(line)
        assert isinstance(obj, dict), line
        assert {"ts", "level", "logger", "msg"} <= obj.keys(), line
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", str(obj["ts"])), line
        objects.append(obj)
    return objects


def by_msg(objects: list[dict[str, object]], msg: str) -> dict[str, object]:
    matches = [o for o in objects if o["msg"] == msg]
    assert len(matches) == 1, (msg, objects)
    return matches[0]


@pytest.fixture(scope="module")
def everything_json() -> subprocess.CompletedProcess[str]:
    return run(EVERYTHING, LOG_FORMAT="json", LOG_LEVEL="info")


def test_json_uncaught_exception_still_exits_1(
    everything_json: subprocess.CompletedProcess[str],
) -> None:
    assert everything_json.returncode == 1


def test_json_every_stderr_line_is_one_log_object(
    everything_json: subprocess.CompletedProcess[str],
) -> None:
    objects = json_lines(everything_json.stderr)
    # Python's records are written once, not re-wrapped by the fd 2 reader.
    assert not [o for o in objects if str(o["msg"]).startswith("{")]
    assert len(objects) == 10


def test_json_rpc_extras_are_top_level_keys(
    everything_json: subprocess.CompletedProcess[str],
) -> None:
    rpc = by_msg(json_lines(everything_json.stderr), "rpc")
    assert rpc == {
        "ts": rpc["ts"],
        "level": "info",
        "logger": "demo",
        "msg": "rpc",
        "rpc_method": "Create",
        "grpc_code": "OK",
        "duration_ms": 1.23,
        "peer": "client-identity",
    }


def test_json_unserialisable_and_clashing_extras_still_give_one_object(
    everything_json: subprocess.CompletedProcess[str],
) -> None:
    odd = by_msg(json_lines(everything_json.stderr), "odd extras")
    assert odd["level"] == "error"
    assert (odd["tags"], odd["ratio"]) == ("{'a'}", "nan")
    assert odd["extra_ts"] == "mine"
    assert odd["ts"] != "mine"


def test_json_multiline_message_stays_one_object(
    everything_json: subprocess.CompletedProcess[str],
) -> None:
    assert by_msg(json_lines(everything_json.stderr), "first\nsecond")["level"] == "warning"


def test_json_warnings_warn_is_captured(everything_json: subprocess.CompletedProcess[str]) -> None:
    [warning] = [o for o in json_lines(everything_json.stderr) if o["logger"] == "py.warnings"]
    assert warning["level"] == "warning"
    assert "UserWarning: careful now" in str(warning["msg"])


def test_json_core_line_on_fd2_is_wrapped_with_its_level(
    everything_json: subprocess.CompletedProcess[str],
) -> None:
    core = by_msg(json_lines(everything_json.stderr), CORE_LINE)
    assert (core["level"], core["logger"]) == ("error", "grpc.core")


def test_json_other_fd2_writes_are_wrapped(
    everything_json: subprocess.CompletedProcess[str],
) -> None:
    objects = json_lines(everything_json.stderr)
    assert by_msg(objects, "plain print")["logger"] == "stderr"
    assert by_msg(objects, "\ufffd\ufffd not utf-8")["level"] == "info"


def test_json_tracebacks_are_one_object_each(
    everything_json: subprocess.CompletedProcess[str],
) -> None:
    objects = json_lines(everything_json.stderr)
    main = by_msg(objects, "uncaught exception")
    assert main["level"] == "critical"
    assert str(main["exception"]).startswith("Traceback (most recent call last):\n")
    assert str(main["exception"]).endswith("RuntimeError: main boom")
    thread = by_msg(objects, "uncaught exception in thread worker")
    assert str(thread["exception"]).endswith("ZeroDivisionError: division by zero")
    [unraisable] = [o for o in objects if str(o["msg"]).startswith("Exception ignored in")]
    assert str(unraisable["exception"]).endswith("KeyError: 'in __del__'")


@pytest.mark.parametrize(
    ("level", "shown"),
    [
        ("debug", {"debug", "info", "warning", "error"}),
        ("DEBUG", {"debug", "info", "warning", "error"}),
        ("info", {"info", "warning", "error"}),
        (" Warn ", {"warning", "error"}),
        ("warning", {"warning", "error"}),
        ("error", {"error"}),
        ("", {"info", "warning", "error"}),
        (None, {"info", "warning", "error"}),
    ],
)
def test_log_level_filters_records(level: str | None, shown: set[str]) -> None:
    result = run(
        "for name in ('debug', 'info', 'warning', 'error'):\n    getattr(log, name)(name)\n",
        LOG_FORMAT="json",
        **({} if level is None else {"LOG_LEVEL": level}),
    )
    assert result.returncode == 0
    assert [o["msg"] for o in json_lines(result.stderr)] == [
        name for name in ("debug", "info", "warning", "error") if name in shown
    ]


def test_unknown_log_level_falls_back_to_info_with_one_warning() -> None:
    result = run("log.debug('d')\nlog.info('i')\n", LOG_FORMAT="json", LOG_LEVEL="verbose")
    objects = json_lines(result.stderr)
    assert [o["msg"] for o in objects][1:] == ["i"]
    assert objects[0]["level"] == "warning"
    assert "unknown LOG_LEVEL 'verbose', using info" in str(objects[0]["msg"])


TEXT_LINE = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z "


def test_text_format_is_one_conventional_line_with_extras() -> None:
    result = run(
        """\
        log.info("rpc", extra={"rpc_method": "Create", "grpc_code": "OK", "duration_ms": 1.23,
                               "peer": "client identity"})
        os.write(2, b"raw stays raw\\n")
        raise RuntimeError("main boom")
        """,
        LOG_FORMAT="text",
    )
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert re.fullmatch(
        TEXT_LINE + 'INFO demo: rpc rpc_method=Create grpc_code=OK duration_ms=1.23 peer="client '
        'identity"',
        lines[0],
    )
    assert lines[1] == "raw stays raw"
    assert re.fullmatch(
        TEXT_LINE + "CRITICAL pyrigaud.entrypoints.logs: uncaught exception", lines[2]
    )
    assert lines[3] == "Traceback (most recent call last):"
    assert lines[-1] == "RuntimeError: main boom"


def test_unknown_log_format_falls_back_to_text_with_one_warning() -> None:
    result = run("log.info('hello')\n", LOG_FORMAT="xml")
    lines = result.stderr.splitlines()
    assert len(lines) == 2
    assert re.fullmatch(
        TEXT_LINE + r"WARNING pyrigaud\.entrypoints\.logs: unknown LOG_FORMAT 'xml', using text .*",
        lines[0],
    )
    assert re.fullmatch(TEXT_LINE + "INFO demo: hello", lines[1])


def test_configuring_twice_does_not_stack_redirections() -> None:
    result = run(
        f"""\
        fds_before = len(os.listdir("/proc/self/fd"))
        configure_logging("info", "json")
        os.write(2, b"{CORE_LINE}\\n")
        log.info("again", extra={{"fds_before": fds_before,
                                  "fds_after": len(os.listdir("/proc/self/fd"))}})
        configure_logging("info", "text")
        os.write(2, b"raw again\\n")
        log.info("after text")
        """,
        LOG_FORMAT="json",
    )
    assert result.returncode == 0
    json_part, text_part = result.stderr.split("raw again\n")
    objects = json_lines(json_part)
    # The fd 2 reader runs beside the logging handler: the two streams may interleave either way.
    assert sorted(str(o["msg"]) for o in objects) == [CORE_LINE, "again"]
    again = by_msg(objects, "again")
    assert again["fds_after"] == again["fds_before"]
    # Back to text, fd 2 is the real stderr again, not an earlier pipe.
    assert re.fullmatch(TEXT_LINE + "INFO demo: after text\n", text_part)


def test_json_nothing_written_to_fd2_is_lost_at_exit() -> None:
    result = run(
        """\
        for i in range(5000):
            os.write(2, b"line %d\\n" % i)
        os.write(2, b"last, without a newline")
        """,
        LOG_FORMAT="json",
    )
    assert result.returncode == 0
    msgs = [o["msg"] for o in json_lines(result.stderr)]
    assert msgs == [f"line {i}" for i in range(5000)] + ["last, without a newline"]


def test_json_grpc_core_messages_are_wrapped() -> None:
    # GRPC_VERBOSITY=debug makes the core write its own warning at start-up; the channel
    # targets a loopback port that was just released, so nothing answers.
    result = run(
        """\
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        import grpc
        no_proxy = [("grpc.enable_http_proxy", 0)]
        channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=no_proxy)
        try:
            grpc.channel_ready_future(channel).result(timeout=0.5)
        except grpc.FutureTimeoutError:
            log.info("nothing listens")
        channel.close()
        """,
        LOG_FORMAT="json",
        GRPC_VERBOSITY="debug",
    )
    assert result.returncode == 0
    objects = json_lines(result.stderr)
    assert by_msg(objects, "nothing listens")["logger"] == "demo"
    core = [o for o in objects if o["logger"] == "grpc.core"]
    assert core
    assert all(re.match(r"[IWEF]\d{4} ", str(o["msg"])) for o in core)
