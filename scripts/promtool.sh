#!/bin/sh
# promtool, to check the alert rules in deploy/monitoring/, taken out of Debian's prometheus
# package without installing it: installing it would start a Prometheus server (and pull in a
# node exporter). Fetched once per package version, cached. Prints the binary's path on stdout.
set -eu

cache="${XDG_CACHE_HOME:-$HOME/.cache}/pyrigaud/promtool"
version=$(apt-cache policy prometheus 2>/dev/null | sed -n 's/^ *Candidate: //p')
if [ -z "$version" ] || [ "$version" = "(none)" ]; then
    echo "promtool.sh: apt-get update (no candidate for prometheus yet)" >&2
    apt-get update -qq >&2
    version=$(apt-cache policy prometheus | sed -n 's/^ *Candidate: //p')
fi
binary="$cache/$version/promtool"
if [ -x "$binary" ]; then
    echo "$binary"
    exit 0
fi

download=$(mktemp -d)
trap 'rm -rf "$download"' EXIT
echo "promtool.sh: fetching prometheus $version for its promtool" >&2
# apt's sandbox user cannot write into a private temporary folder: download as the caller.
(cd "$download" && apt-get download -qq -o APT::Sandbox::User="$(id -un)" "prometheus=$version" >&2)
mkdir -p "$cache/$version"
dpkg-deb --fsys-tarfile "$download"/prometheus_*.deb | tar -x -O ./usr/bin/promtool > "$binary.tmp"
chmod 0755 "$binary.tmp"
mv "$binary.tmp" "$binary"
echo "$binary"
