"""`pyrigaud serve` (and the conformance kit's command): arguments and settings parsed, the
provider built by `bootstrap` and run until SIGTERM, then drained."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from returns.result import Failure, Success

from pyrigaud.entrypoints.bootstrap import bootstrap
from pyrigaud.entrypoints.container import Container
from pyrigaud.entrypoints.logs import configure_logging
from pyrigaud.entrypoints.settings import Settings, SettingsError, load_settings

logger = logging.getLogger("pyrigaud")

EXIT_CONFIG = 2
EXIT_START = 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pyrigaud", description="VirtRigaud remote provider")
    commands = parser.add_subparsers(dest="command")
    serve = commands.add_parser("serve", help="run the provider gRPC service (the default)")
    serve.add_argument("--port", type=int, help="gRPC port (default 9443)")
    serve.add_argument("--health-port", type=int, help="HTTP health port (default 8080)")
    serve.add_argument("--listen-address", help="bind address (default: all interfaces)")
    serve.add_argument("--config", type=Path, help="TOML file of settings (PYRIGAUD_CONFIG)")
    _add_kit(commands)
    return parser


def _add_kit(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The operator's kit (pyrigaud.client): a client CLI and `conformance`, any endpoint."""
    from pyrigaud.client.kit import add_kit  # noqa: PLC0415 - the kit stays out of serve's way

    add_kit(commands)


def _run_kit(args: argparse.Namespace) -> int:
    from pyrigaud.client.kit import run_kit  # noqa: PLC0415

    return run_kit(args)


def main(argv: list[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if not arguments or (arguments[0].startswith("-") and arguments[0] not in ("-h", "--help")):
        arguments.insert(0, "serve")  # the manager runs the image with only --port/--health-port
    args = _parser().parse_args(arguments)
    if args.command != "serve":
        return _run_kit(args)
    try:
        settings = load_settings(
            os.environ,
            {
                "PYRIGAUD_PORT": args.port,
                "PYRIGAUD_HEALTH_PORT": args.health_port,
                "PYRIGAUD_LISTEN_ADDRESS": args.listen_address,
            },
            args.config,
            staging_types=Container.staging_types(),
        )
    except SettingsError as error:
        configure_logging(os.environ.get("LOG_LEVEL"), os.environ.get("LOG_FORMAT"))
        logger.error("invalid configuration: %s", error)
        return EXIT_CONFIG
    configure_logging(settings.log_level, settings.log_format)
    return serve(settings)


def serve(settings: Settings) -> int:
    """Run the provider until SIGTERM or SIGINT, then drain and return 0; EXIT_START when it
    cannot start."""
    match bootstrap(settings):
        case Failure(error):
            logger.error("refusing to start: %s", error)
            return EXIT_START
        case Success(application):
            pass
    stopping = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        logger.info("received %s: draining", signal.Signals(signum).name)
        stopping.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    application.start()
    stopping.wait()
    application.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
