# Sourced by scripts/serve and scripts/test: a virtual environment with pyrigaud installed.
#
# Works on a fresh Debian (12 or 13): installs python3-venv when the system Python lacks it,
# then creates the venv with the system interpreter. PYRIGAUD_VENV picks the folder.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${PYRIGAUD_VENV:-$ROOT/.venv}
PYTHON=${PYRIGAUD_PYTHON:-/usr/bin/python3}

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
        echo "need root to run: $*" >&2; return 1; fi
}

ensure_system_packages() {
    # $@: Debian packages; installed only when missing, after one apt-get update.
    local missing=()
    for package in "$@"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" \
            || missing+=("$package")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "installing system packages: ${missing[*]}" >&2
        as_root apt-get update -qq
        DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

archive_offers_newer() {
    # $1: a Debian root (a debootstrap tree, a mounted image). Whether the apt sources the root
    # lists now offer a newer version of any package installed there, read with this
    # machine's apt, the root's dpkg status and lists of its own: a cache made before an
    # update is stale. Status 2 when the sources cannot be read (offline): keep what you have.
    local root=$1 state upgrades
    state=$(mktemp -d)
    mkdir -p "$state/lists/partial" "$state/cache/archives/partial"
    local apt_options=(
        -o Dir::Etc::SourceList="$root/etc/apt/sources.list"
        -o Dir::Etc::SourceParts="$root/etc/apt/sources.list.d"
        -o Dir::Etc::Preferences="$state/none" -o Dir::Etc::PreferencesParts="$state/none"
        -o Dir::State::Lists="$state/lists" -o Dir::Cache="$state/cache"
        -o Dir::State::status="$root/var/lib/dpkg/status"
        -o Dir::State::extended_states="$state/extended_states"
        -o APT::Default-Release= -o Debug::NoLocking=1 -o APT::Sandbox::User=root
    )
    if ! apt-get "${apt_options[@]}" update -qq >/dev/null 2>&1; then
        rm -rf "$state"
        echo "cannot read the apt sources of $root to tell whether it is current: kept" >&2
        return 2
    fi
    upgrades=$(apt-get "${apt_options[@]}" -s dist-upgrade 2>/dev/null | grep -c '^Inst ' || true)
    rm -rf "$state"
    [ "$upgrades" -gt 0 ]
}

ensure_libnfs() {
    # libnfs for adapters/staging/nfs.py: this Debian release's package (libnfs13 on 12,
    # libnfs14 on 13), as scripts/libnfs-package.sh names it.
    local package
    package=$(sh "$ROOT/scripts/libnfs-package.sh")
    ensure_system_packages "$package"
}

ensure_venv() {
    # $1: the pip requirement to install, e.g. ".[dev]".
    if [ ! -x "$PYTHON" ]; then ensure_system_packages python3; fi
    if ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null; then
        ensure_system_packages python3-venv
    fi
    local version
    version=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
        echo "pyrigaud needs Python >= 3.11; $PYTHON is $version" >&2
        return 1
    fi
    if [ ! -x "$VENV/bin/python" ]; then
        "$PYTHON" -m venv "$VENV"
    fi
    "$VENV/bin/python" -m pip install -qq --disable-pip-version-check --upgrade pip
    # A regular (not editable) install: mypy checks the installed package, and the tests run
    # against exactly what a user would get. setuptools builds in ./build and never removes a
    # file from there: a module moved or deleted since the last install would be installed again.
    rm -rf "$ROOT/build"
    "$VENV/bin/python" -m pip install -qq --disable-pip-version-check --force-reinstall --no-deps "$ROOT"
    "$VENV/bin/python" -m pip install -qq --disable-pip-version-check "$ROOT$1"
}
