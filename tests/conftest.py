"""Loaded before any test module: the process-wide settings every test process needs."""

# Import the entrypoints package first: it turns gRPC's fork handlers off before grpc is
# imported (see its docstring), as `pyrigaud serve` does, for the servers tests run in-process.
import pyrigaud.entrypoints  # noqa: F401
