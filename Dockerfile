# pyrigaud: one image for both backends (libvirt over qemu+ssh, vSphere).
# Builder compiles libvirt-python against libvirt-dev into a venv; the final stage copies only
# that venv onto a slim base with the runtime libraries, so no compiler ships.
#
# BASE: both stages start from it. The official Python image by default; any Debian bookworm
# root works too (docs/container.md: one made by debootstrap where Docker Hub is out of reach):
# a base without python3 gets Debian's (3.11 on bookworm) from apt, in the builder with its
# headers and venv, in the final stage the interpreter alone, at the path the venv points to.
ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS builder
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc pkg-config libvirt-dev \
    && if ! command -v python3 >/dev/null; then \
        apt-get install -y --no-install-recommends python3-dev python3-venv; fi \
    && rm -rf /var/lib/apt/lists/*
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
# PIP_CERT: a CA bundle for pip where a TLS-inspecting proxy stands between the build and PyPI;
# the bundle is mounted for the build only (docs/container.md) and the builder never ships.
ARG PIP_CERT
RUN python3 -m venv /opt/pyrigaud
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
# The install the tests use (pip install <repo>), with the backends' extras instead of dev.
# pip compiles bytecode here, at build time: at run time the root filesystem is read-only.
RUN /opt/pyrigaud/bin/python -m pip install '.[libvirt,vsphere,s3]'

FROM ${BASE}
# libvirt0: libvirt-python's shared library; openssh-client: the qemu+ssh transport, which
# refuses to run for a uid without a passwd entry, hence the pyrigaud user (home /tmp);
# libnfs: the userspace NFS client of nfs:// migration staging (no mount in a pod), the package
# of this base's Debian release (libnfs13 on bookworm, libnfs14 on trixie), named by
# scripts/libnfs-package.sh, which the build mounts and leaves out of the image;
# qemu-utils: qemu-img, which checks a staged image before vCenter gets it (run under prlimit,
# util-linux's, which every Debian image has).
RUN --mount=type=bind,source=scripts/libnfs-package.sh,target=/tmp/libnfs-package.sh \
    libnfs=$(sh /tmp/libnfs-package.sh) \
    && apt-get update \
    && apt-get install -y --no-install-recommends libvirt0 openssh-client "$libnfs" qemu-utils \
    && if ! command -v python3 >/dev/null; then \
        apt-get install -y --no-install-recommends python3; fi \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 65532 pyrigaud \
    && useradd --uid 65532 --gid 65532 --home-dir /tmp --no-create-home \
        --shell /usr/sbin/nologin pyrigaud
COPY --from=builder /opt/pyrigaud /opt/pyrigaud
# Read-only root filesystem: nothing may write outside /tmp (an emptyDir in the pod).
ENV PATH=/opt/pyrigaud/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
WORKDIR /tmp
USER 65532:65532
EXPOSE 9443 8080
# The manager appends --port=<port> --health-port=8080.
ENTRYPOINT ["pyrigaud", "serve"]
