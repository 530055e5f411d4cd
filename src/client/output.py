"""How the client CLI answers: a table or JSON on stdout; a gRPC error as its code, its
message and an exit code per class (scripts branch on it)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

EXIT_OTHER = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_INVALID = 4
EXIT_UNAVAILABLE = 5
EXIT_TASK_FAILED = 6
EXIT_INTERRUPTED = 130

EXIT_BY_CODE = {
    grpc.StatusCode.NOT_FOUND: EXIT_NOT_FOUND,
    grpc.StatusCode.INVALID_ARGUMENT: EXIT_INVALID,
    grpc.StatusCode.UNAVAILABLE: EXIT_UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED: EXIT_UNAVAILABLE,
}


def exit_code(code: grpc.StatusCode) -> int:
    return EXIT_BY_CODE.get(code, EXIT_OTHER)


def report_error(error: grpc.RpcError) -> int:
    code: grpc.StatusCode = error.code()
    print(f"error: {code.name}: {error.details()}", file=sys.stderr)
    return exit_code(code)


def as_dict(message: Message) -> dict[str, Any]:
    return MessageToDict(message, preserving_proto_field_name=True)


def _cell(value: object) -> str:
    if isinstance(value, list):
        return ",".join(_cell(item) for item in value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _full(message: Message) -> dict[str, Any]:
    return MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def render(message: Message, output: str, task_status: Message | None = None) -> str:
    """One answer (and the status its task ended in, after --wait): JSON, or `field  value`
    lines (every field, zero values too)."""
    data = _full(message)
    if task_status is not None:
        data["task_status"] = _full(task_status)
    if output == "json":
        return json.dumps(data, indent=2)
    width = max((len(key) for key in data), default=0)
    return "\n".join(f"{key:<{width}}  {_cell(value)}" for key, value in data.items())


def render_rows(rows: Sequence[dict[str, Any]], columns: Sequence[str], output: str) -> str:
    if output == "json":
        return json.dumps(list(rows), indent=2)
    cells = [[_cell(row.get(column, "")) for column in columns] for row in rows]
    widths = [
        max([len(column), *(len(line[index]) for line in cells)])
        for index, column in enumerate(columns)
    ]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines.extend(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in cells
    )
    return "\n".join(lines)
