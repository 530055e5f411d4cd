"""`pyrigaud conformance ENDPOINT`: argument parsing, the progress line, the exit code."""

from __future__ import annotations

import argparse
import json
import secrets
import sys
from pathlib import Path
from typing import TextIO

from pyrigaud.client.conformance import report as reports
from pyrigaud.client.conformance.catalogue import Clause, selected
from pyrigaud.client.conformance.runner import Progress, Result, run
from pyrigaud.client.conformance.session import Options, Session, Staging
from pyrigaud.client.connection import EndpointError, Target, open_channel, stub_for

EXIT_CONFORMANT = 0
EXIT_NOT_CONFORMANT = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("endpoint", help="HOST:PORT of a provider.v1.Provider")
    parser.add_argument("--tls-dir", type=Path, help="dir with tls.crt, tls.key, ca.crt (mTLS)")
    parser.add_argument("--server-name", default="", help="the name the server cert must carry")
    parser.add_argument("--read-only", action="store_true", help="only clauses that change nothing")
    parser.add_argument(
        "--prefix", default="", help="name prefix of the run's VMs (default conformance-XXXX)"
    )
    parser.add_argument(
        "--image-json",
        default="",
        help='a VMImage object for Create, e.g. \'{"TemplateName": "tmpl"}\' (default: no image)',
    )
    parser.add_argument(
        "--placement-json",
        default="",
        help='a Placement object for Create, e.g. \'{"Datastore": "pool"}\' (default: none)',
    )
    parser.add_argument(
        "--graceful-timeout", type=int, default=10, help="graceful_timeout_seconds to send"
    )
    parser.add_argument(
        "--prepare-image-json",
        default="",
        help="the ImagePrepare image_json for a claimed image import, e.g. "
        '\'{"source": {"libvirt": {"path": "/var/lib/images/base.qcow2"}}}\'',
    )
    parser.add_argument(
        "--staging-url", default="", help="where a claimed ExportDisk/ImportDisk stages the disk"
    )
    parser.add_argument(
        "--staging-backend", choices=("pvc", "s3", "nfs"), default="pvc", help="its backend_type"
    )
    parser.add_argument(
        "--storage-options-json", default="", help="its storage_options_json, sent as given"
    )
    parser.add_argument(
        "--staging-credential",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a credentials entry for the staging store (repeatable; never shown)",
    )
    parser.add_argument("--junit", type=Path, help="write a JUnit XML report")
    parser.add_argument("--json", type=Path, help="write a JSON report")


def _object(flag: str, text: str) -> dict[str, object]:
    if not text:
        return {}
    parsed = json.loads(text)
    if not isinstance(parsed, dict):
        raise ValueError(f"{flag} must be a JSON object")
    return parsed


def _staging(args: argparse.Namespace) -> Staging | None:
    if not args.staging_url:
        return None
    _object("--storage-options-json", args.storage_options_json)  # a JSON object, or empty
    credentials = {}
    for entry in args.staging_credential:
        key, equals, value = entry.partition("=")
        if not (key and equals):
            raise ValueError("--staging-credential must be KEY=VALUE")  # the value stays unsaid
        credentials[key] = value
    return Staging(args.staging_url, args.staging_backend, args.storage_options_json, credentials)


def _progress(stream: TextIO) -> Progress:
    live = stream.isatty()

    def show(index: int, total: int, clause: Clause, result: Result | None) -> None:
        head = f"[{index + 1:>2}/{total}] {clause.key}"
        if result is None:
            if live:
                stream.write(f"\r\033[K{head} ...")
                stream.flush()
            return
        line = f"{head}: {result.outcome.value} ({result.seconds:.1f} s)"
        stream.write(f"\r\033[K{line}\n" if live else f"{line}\n")
        stream.flush()

    return show


def main(args: argparse.Namespace) -> int:
    try:
        image = _object("--image-json", args.image_json)
        placement = _object("--placement-json", args.placement_json)
        prepare_image = _object("--prepare-image-json", args.prepare_image_json)
        staging = _staging(args)
        channel = open_channel(Target(args.endpoint, args.tls_dir, args.server_name))
    except (ValueError, EndpointError) as error:
        print(f"pyrigaud conformance: {error}", file=sys.stderr)
        return EXIT_USAGE
    prefix = args.prefix or f"conformance-{secrets.token_hex(3)}"
    options = Options(prefix, image, placement, args.graceful_timeout, prepare_image, staging)
    with channel:
        session = Session(stub_for(channel), options)
        report = run(args.endpoint, selected(args.read_only), session, _progress(sys.stderr))
    print(reports.table(report))
    if args.json:
        reports.write(args.json, reports.as_json(report))
    if args.junit:
        reports.write(args.junit, reports.junit(report))
    if report.interrupted:
        return EXIT_INTERRUPTED
    return EXIT_CONFORMANT if report.ok else EXIT_NOT_CONFORMANT
