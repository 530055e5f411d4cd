#!/bin/sh
# Build the vCenter simulator launcher (tools/vcsim) offline from Debian's govmomi source.
# Installs golang-go and golang-github-vmware-govmomi-dev with apt when missing; rebuilds only
# when what the binary is built from changed: the launcher's source, this script, or a Debian
# Go package (the toolchain, govmomi and the libraries it builds with). Prints the binary's
# path on stdout.
set -eu

repo=$(cd "$(dirname "$0")/.." && pwd)
source_file="$repo/tools/vcsim/main.go"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/pyrigaud/vcsim"
binary="$cache/vcsim-launcher"
stamp="$cache/inputs.sha256"
govmomi=/usr/share/gocode/src/github.com/vmware/govmomi/simulator

if ! command -v go >/dev/null 2>&1 || [ ! -d "$govmomi" ]; then
    echo "vcsim.sh: installing golang-go golang-github-vmware-govmomi-dev" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go golang-github-vmware-govmomi-dev >&2
fi

# Every Go package builds from /usr/share/gocode or is the toolchain: all their versions count.
digest=$(
    {
        sha256sum "$source_file" "$0"
        go version
        dpkg-query -W -f='${Package}=${Version}\n' 'golang-*'
    } | sha256sum | cut -d' ' -f1
)
if [ -x "$binary" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$digest" ]; then
    echo "$binary"
    exit 0
fi

mkdir -p "$cache/gopath/src/pyrigaud-vcsim"
cp "$source_file" "$cache/gopath/src/pyrigaud-vcsim/main.go"
echo "vcsim.sh: building $binary" >&2
GO111MODULE=off GOPATH="$cache/gopath:/usr/share/gocode" \
    GOCACHE="$cache/gocache" go build -o "$binary.tmp" pyrigaud-vcsim
mv "$binary.tmp" "$binary"
echo "$digest" > "$stamp"
echo "$binary"
