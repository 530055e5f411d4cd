#!/usr/bin/env bash
# The NFS staging tests on Debian 13 (trixie), whatever Debian this machine runs: a trixie root
# made with debootstrap (python3, nfs-ganesha, rpcbind and trixie's libnfs, libnfs14), a venv in
# it with this repository installed, and pytest run there by chroot in a network namespace of
# its own. There, the tests start their own rpcbind on port 111 and nfs-ganesha, all on the
# namespace's loopback: nothing collides with this machine's portmapper, and nothing leaves.
# The PID and mount namespaces end every server and undo every mount when pytest exits.
#
# The root, venv included, is kept in PYRIGAUD_TRIXIE_ROOT (default
# /var/cache/pyrigaud/trixie-root) and made again when what it is made from changed: the way
# it is made (make_root below, its package list), or a package trixie now has a newer version
# of than the root holds. Needs root (debootstrap, chroot, namespaces) and iproute2's `ip`.
source "$(dirname "$0")/bootstrap.sh"

TRIXIE_ROOT=${PYRIGAUD_TRIXIE_ROOT:-/var/cache/pyrigaud/trixie-root}
PACKAGES="python3,python3-venv,nfs-ganesha,nfs-ganesha-vfs,rpcbind,$(sh "$ROOT/scripts/libnfs-package.sh" trixie)"
STAMP=.pyrigaud-recipe  # the digest of how the root was made
INSIDE_REPO=/srv/pyrigaud  # where the repository is copied, inside the root
INSIDE_VENV=/opt/pyrigaud-venv
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt  # Debian's ca-certificates
PYTEST_ARGS=(-k nfs tests/unit/test_libnfs_releases.py tests/integration/staging)

root_recipe() {
    # How the root is made: make_root's own text, and the packages it installs.
    { declare -f make_root; echo "$PACKAGES"; } | sha256sum | cut -d' ' -f1
}

root_is_current() {
    [ "$(cat "$TRIXIE_ROOT/$STAMP" 2>/dev/null)" = "$(root_recipe)" ] || return 1
    local newer=0
    archive_offers_newer "$TRIXIE_ROOT" || newer=$?
    if [ "$newer" -eq 0 ]; then echo "trixie has newer packages than $TRIXIE_ROOT" >&2; fi
    [ "$newer" -ne 0 ]
}

make_root() {
    ensure_system_packages debootstrap
    echo "making a Debian 13 root in $TRIXIE_ROOT" >&2
    rm -rf "$TRIXIE_ROOT" "$TRIXIE_ROOT.new"
    debootstrap --variant=minbase --include="$PACKAGES" trixie "$TRIXIE_ROOT.new" >/dev/null
    root_recipe >"$TRIXIE_ROOT.new/$STAMP"
    mv "$TRIXIE_ROOT.new" "$TRIXIE_ROOT"
}

install_repository() {
    # A copy, not a bind mount: pip builds in the tree, and this one stays untouched.
    rm -rf "${TRIXIE_ROOT:?}$INSIDE_REPO" "$TRIXIE_ROOT/tmp"
    mkdir -p "$TRIXIE_ROOT$INSIDE_REPO" "$TRIXIE_ROOT/tmp"
    chmod 1777 "$TRIXIE_ROOT/tmp"
    tar -C "$ROOT" --exclude=./.git --exclude=./.venv --exclude=./build -cf - . \
        | tar -C "$TRIXIE_ROOT$INSIDE_REPO" -xf -
    # pip reaches the package index before the namespace, with this machine's resolver and
    # the certificates it trusts (those of a TLS-inspecting proxy too, where there is one).
    cp /etc/resolv.conf "$TRIXIE_ROOT/etc/resolv.conf"
    mkdir -p "$TRIXIE_ROOT/etc/ssl/certs"
    cp "$CA_BUNDLE" "$TRIXIE_ROOT$CA_BUNDLE"
    chroot "$TRIXIE_ROOT" env PYRIGAUD_VENV="$INSIDE_VENV" PIP_CERT="$CA_BUNDLE" bash -c \
        "source $INSIDE_REPO/scripts/bootstrap.sh && ensure_venv '[dev,s3]'"
}

run_tests() {
    # The namespace's only interface is its own loopback. nfs-ganesha resolves Bind_Addr for an
    # IPv6 socket (v4-mapped) with AI_ADDRCONFIG, which glibc answers only where an IPv6
    # address other than ::1 exists: lo gets a documentation address (RFC 3849) nothing dials.
    # Its VFS export must find the export's filesystem in /etc/mtab, so the root is bound onto
    # itself (a mount of its own, seen from inside) and /proc is the new PID namespace's.
    ln -sfn ../proc/self/mounts "$TRIXIE_ROOT/etc/mtab"
    unshare --net --mount --pid --fork bash -euc '
        ip link set lo up
        ip address add 2001:db8::1/128 dev lo
        mount --bind "$0" "$0"
        mount -t proc proc "$0/proc"
        mount --rbind /dev "$0/dev"
        exec chroot "$0" env -C "$1" "$2/bin/python" -m pytest -q "${@:3}"
    ' "$TRIXIE_ROOT" "$INSIDE_REPO" "$INSIDE_VENV" "${PYTEST_ARGS[@]}"
}

echo "== NFS staging tests on Debian 13 (a trixie root, in a network namespace of its own)"
ensure_system_packages iproute2  # `ip`, in the namespace
mkdir -p "$(dirname "$TRIXIE_ROOT")"
exec 9>"$TRIXIE_ROOT.lock"
flock 9  # one run at a time uses the root and its venv
root_is_current || make_root
install_repository
run_tests
