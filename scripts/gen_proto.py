"""Generate the Python stubs of proto/provider/v1/provider.proto into the package.

protoc writes imports as `from provider.v1 import provider_pb2`, which only works when the
generated folder is top-level; we rewrite that one import so the stubs live inside
pyrigaud.entrypoints.grpc.generated. `--check` regenerates into a scratch folder and fails
when the committed stubs differ (run by the test command).
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PROTO_FILE = PROTO_ROOT / "provider" / "v1" / "provider.proto"
PACKAGE_DIR = ROOT / "src" / "entrypoints" / "grpc" / "generated"
PACKAGE = "pyrigaud.entrypoints.grpc.generated"
STUB_DIR = Path("provider") / "v1"
STUB_FILES = (
    "provider_pb2.py",
    "provider_pb2.pyi",
    "provider_pb2_grpc.py",
    "provider_pb2_grpc.pyi",
)


def generate(out: Path) -> None:
    """Run protoc (grpcio-tools + mypy-protobuf plugins from this interpreter's venv) into out."""
    bin_dir = Path(sys.executable).parent
    command = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
        f"--mypy_out=quiet:{out}",
        f"--mypy_grpc_out=quiet:{out}",
        str(PROTO_FILE),
    ]
    subprocess.run(command, check=True)  # noqa: S603 - our own fixed command line
    for name in STUB_FILES:
        path = out / STUB_DIR / name
        text = path.read_text()
        text = text.replace("from provider.v1 import", f"from {PACKAGE}.provider.v1 import")
        path.write_text(text)
    for package in (out / "provider", out / STUB_DIR):
        (package / "__init__.py").write_text("")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if committed stubs are stale")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch)
        generate(out)
        if args.check:
            stale = [
                name
                for name in STUB_FILES
                if not (PACKAGE_DIR / STUB_DIR / name).exists()
                or not filecmp.cmp(out / STUB_DIR / name, PACKAGE_DIR / STUB_DIR / name, False)
            ]
            if stale:
                print(f"generated stubs are stale: {', '.join(stale)}; run scripts/gen_proto.py")
                return 1
            print("generated stubs are up to date")
            return 0
        target = PACKAGE_DIR / "provider"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(out / "provider", target)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
