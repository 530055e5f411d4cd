"""The ways in: gRPC, HTTP health, the CLI, and the composition root.

gRPC's fork handlers are turned off before anything here imports grpc: libvirt's `qemu+ssh`
transport forks the ssh binary from RPC worker threads, and with the handlers on, about one
child in three dies in grpc's epoll code ("Bad file descriptor"). pyrigaud itself never forks.
"""

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
