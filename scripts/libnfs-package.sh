#!/bin/sh
# Prints the Debian package of the libnfs that adapters/staging/libnfs.py speaks (its RELEASES)
# on a Debian release: this machine's (/etc/os-release), or the codename given. Debian 12
# (bookworm) ships libnfs 4.0 as libnfs13, Debian 13 (trixie) libnfs 5.0 as libnfs14. Another
# release is refused rather than guessed: libnfs 6 changed the read/write signatures, so a new
# release's libnfs is checked and added to both lists first. POSIX sh, for a slim image's RUN.
set -eu
codename=${1:-$(. /etc/os-release && echo "${VERSION_CODENAME:-}")}
case "$codename" in
    bookworm) echo libnfs13 ;;
    trixie) echo libnfs14 ;;
    *)
        echo "libnfs-package.sh: no libnfs known for Debian release '$codename'" >&2
        exit 1
        ;;
esac
