#!/usr/bin/env bash
# Build the image from the Dockerfile with Debian's buildah (no Docker engine needed); needs root.
# Prints the image's name on stdout; tests/deploy/test_container_image.py runs it.
#
# BASE (the Dockerfile's build argument): PYRIGAUD_IMAGE_BASE when set (e.g.
# python:3.11-slim-bookworm where Docker Hub is reachable), else a Debian bookworm root made by
# debootstrap from the Debian mirror, kept as localhost/pyrigaud-base:bookworm and remade when
# what it is made from changed: the way it is made (make_debootstrap_base), or a package
# bookworm (with its updates and security updates) now has a newer version of. The store
# (tools/container-engine/storage.conf) outlives a run: the base is kept, and the image is
# rebuilt only when what it is built from changed. docs/container.md explains it all.
source "$(dirname "$0")/bootstrap.sh"

IMAGE=localhost/pyrigaud:test
# The digest of what the image was built from: an image with the current one is not rebuilt.
INPUTS_LABEL=io.pyrigaud.build-inputs
DEBOOTSTRAP_BASE=localhost/pyrigaud-base:bookworm
# The digest of how the base was made (base_recipe).
BASE_RECIPE_LABEL=io.pyrigaud.base-recipe
MIRROR=http://deb.debian.org/debian
# The host's CA bundle, mounted into the build for pip only: where a TLS-inspecting proxy
# stands before PyPI, the host trusts it and the base image does not.
HOST_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
BUILD_CA_BUNDLE=/run/pyrigaud-build-ca.crt
LOG=/var/cache/pyrigaud/container-image.log

if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/container-image.sh must run as root" >&2
    exit 1
fi
export CONTAINERS_STORAGE_CONF=$ROOT/tools/container-engine/storage.conf
export CONTAINERS_CONF=$ROOT/tools/container-engine/containers.conf

base_recipe() {
    # How the base is made: make_debootstrap_base's own text (its sources included).
    { declare -f make_debootstrap_base; echo "$MIRROR"; } | sha256sum | cut -d' ' -f1
}

base_is_current() {
    # Made as make_debootstrap_base makes it now, and holding the newest version bookworm's
    # sources (those it lists) have of each of its packages.
    [ "$(podman image inspect --format "{{index .Labels \"$BASE_RECIPE_LABEL\"}}" \
        "$DEBOOTSTRAP_BASE" 2>/dev/null)" = "$(base_recipe)" ] || return 1
    local rootfs newer=0
    rootfs=$(podman image mount "$DEBOOTSTRAP_BASE") || return 1
    archive_offers_newer "$rootfs" || newer=$?
    podman image unmount "$DEBOOTSTRAP_BASE" >/dev/null
    if [ "$newer" -eq 0 ]; then echo "container-image.sh: bookworm has newer packages" >&3; fi
    [ "$newer" -ne 0 ]
}

make_debootstrap_base() {
    # minbase: apt, dpkg and the required packages (passwd, util-linux), as in the slim
    # images; sources as the official image lists them, security updates applied, no caches.
    echo "container-image.sh: making $DEBOOTSTRAP_BASE with debootstrap" >&3
    local container=pyrigaud-base-work rootfs
    buildah rm "$container" >/dev/null 2>&1 || true # what a failed run left
    buildah from --name "$container" scratch >/dev/null
    rootfs=$(buildah mount "$container")
    debootstrap --variant=minbase bookworm "$rootfs" "$MIRROR" >&2
    rm -f "$rootfs/etc/apt/sources.list" "$rootfs/etc/resolv.conf" "$rootfs/etc/hostname"
    cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --cmd /bin/bash --label "$BASE_RECIPE_LABEL=$(base_recipe)" "$container"
    buildah run --isolation chroot "$container" -- sh -c \
        'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get upgrade -y -qq \
         && apt-get clean && rm -rf /var/lib/apt/lists/*' >&2
    buildah umount "$container" >/dev/null
    buildah commit --rm --quiet "$container" "$DEBOOTSTRAP_BASE" >/dev/null
}

inputs_digest() {
    # $1: the base; then the build's arguments. A digest of all the build reads: the
    # Dockerfile, its context (every file under the paths .dockerignore lets in, with its
    # `!path` lines; a superset of what it lets through), the base image, the arguments, and
    # this script, which runs the build.
    local base_id
    base_id=$(podman image inspect --format '{{.Id}}' "$1" 2>/dev/null || echo "$1")
    (
        cd "$ROOT" || exit 1
        local context
        mapfile -t context < <(sed -n 's|^!\(.*[^/]\)/*$|\1|p' .dockerignore)
        printf '%s\n' "$base_id" "${@:2}"
        find Dockerfile .dockerignore scripts/container-image.sh "${context[@]}" -type f -print0 \
            | sort -z | xargs -0 sha256sum
    ) | sha256sum | cut -d' ' -f1
}

build() {
    # $1: the base. Skipped when the image was built from the same inputs; otherwise one
    # working container per stage (no --layers: vfs copies each layer whole, so a layer per
    # instruction costs more than the cache saves).
    local base=$1
    local arguments=(--build-arg "BASE=$base")
    if [ -r "$HOST_CA_BUNDLE" ]; then
        arguments+=(--build-arg "PIP_CERT=$BUILD_CA_BUNDLE"
            --volume "$HOST_CA_BUNDLE:$BUILD_CA_BUNDLE:ro")
    fi
    local digest
    digest=$(inputs_digest "$base" "${arguments[@]}")
    if [ "$(podman image inspect --format "{{index .Labels \"$INPUTS_LABEL\"}}" "$IMAGE" \
        2>/dev/null)" = "$digest" ]; then
        return
    fi
    echo "container-image.sh: building $IMAGE on $base" >&3
    buildah bud --isolation chroot --layers=false --quiet "${arguments[@]}" \
        --label "$INPUTS_LABEL=$digest" --tag "$IMAGE" "$ROOT" >&2
    # The image this one replaces, and the builder stage (vfs keeps every layer whole).
    buildah rmi --prune >/dev/null
}

show_log_on_failure() {
    local status=$?
    if [ "$status" -ne 0 ]; then
        tail -n 60 "$LOG" >&3
        echo "container-image.sh failed; the whole log: $LOG" >&3
    fi
}

ensure_system_packages buildah podman runc debootstrap
mkdir -p /var/cache/pyrigaud
exec 9>/var/cache/pyrigaud/container-image.lock
flock 9
# The build's chatter goes to a log, shown (its end) only when the build fails.
exec 3>&2 2>"$LOG"
trap show_log_on_failure EXIT
if [ -n "${PYRIGAUD_IMAGE_BASE:-}" ]; then
    build "$PYRIGAUD_IMAGE_BASE"
else
    base_is_current || make_debootstrap_base
    build "$DEBOOTSTRAP_BASE"
fi
echo "$IMAGE"
