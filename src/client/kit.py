"""The kit's commands in one place: added under `pyrigaud` (the server's CLI), or run on their
own as `python -m pyrigaud.client`, which loads none of the server's code."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pyrigaud.client import cli
from pyrigaud.client.conformance import command as conformance


def add_kit(subparsers: Any) -> None:
    """The client's commands and `conformance`, under a parser's subcommands."""
    cli.add_commands(subparsers)
    checking = subparsers.add_parser("conformance", help="check a provider.v1 endpoint")
    conformance.add_arguments(checking)


def run_kit(args: argparse.Namespace) -> int:
    if args.command == "conformance":
        return conformance.main(args)
    return cli.run(args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pyrigaud.client", description="a client for any provider.v1 endpoint"
    )
    add_kit(parser.add_subparsers(dest="command", required=True))
    return run_kit(parser.parse_args(sys.argv[1:] if argv is None else argv))
