#!/usr/bin/env bash
# A running libvirtd + QEMU on this machine for the real-QEMU tests; idempotent, needs root.
#
# Installs the daemon and QEMU (Debian 12/13), removes libvirt's `default` NAT network before
# the daemon can autostart it (tests may not send traffic to its private range), opens
# /dev/kvm to the kvm group (a root-only /dev/kvm makes libvirt re-probe QEMU on every call),
# and starts the daemon: through systemd when it is PID 1, else in the background under a
# child subreaper (so QEMU processes that exit are reaped at once and destroy stays fast).
set -euo pipefail

URI=qemu:///system
PIDFILE=/run/pyrigaud-libvirtd.pid
LOG=/var/log/pyrigaud-libvirtd.log
NETWORKS=/etc/libvirt/qemu/networks
WAIT_SECONDS=60

if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/libvirtd.sh must run as root" >&2
    exit 1
fi

answers() {
    timeout 10 virsh -c "$URI" version >/dev/null 2>&1
}

install_packages() {
    local missing=()
    # ovmf and swtpm: UEFI, secure boot and an emulated TPM for guests that ask for them.
    for package in libvirt-daemon-system qemu-system-x86 qemu-utils python3-minimal ovmf swtpm swtpm-tools; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" \
            || missing+=("$package")
    done
    [ ${#missing[@]} -eq 0 ] && return
    echo "installing: ${missing[*]}" >&2
    # Package scripts must not start the daemon: it would autostart the NAT network.
    local policy=/usr/sbin/policy-rc.d
    local own_policy=no
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 0755 "$policy"
        own_policy=yes
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
    if [ "$own_policy" = yes ]; then rm -f "$policy"; fi
}

forget_nat_network() {
    # libvirt-daemon-config-network (a hard dependency) defines `default` with autostart.
    rm -f "$NETWORKS/autostart/default.xml" "$NETWORKS/default.xml"
}

open_kvm_to_group() {
    [ -e /dev/kvm ] || return 0
    getent group kvm >/dev/null || groupadd --system kvm
    chgrp kvm /dev/kvm
    chmod 0660 /dev/kvm
}

daemons() {
    # The monolithic daemon where the package ships it, else the modular ones QEMU needs.
    if command -v libvirtd >/dev/null; then echo libvirtd; else echo virtqemud virtstoraged; fi
}

start_daemon() {
    if [ "$(ps -p 1 -o comm=)" = systemd ]; then
        local units=(virtlogd.service)
        for daemon in $(daemons); do units+=("$daemon.service"); done
        systemctl start "${units[@]}"
        return
    fi
    if [ -s "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
        return # ours, still starting
    fi
    pgrep -x virtlogd >/dev/null || virtlogd -d
    # The subreaper writes its own pid file and runs the daemons in the foreground as its
    # children; it exits when they all have.
    # shellcheck disable=SC2046 # one word per daemon
    setsid python3 - "$PIDFILE" $(daemons) >>"$LOG" 2>&1 </dev/null <<'PY' &
import ctypes, os, subprocess, sys

PR_SET_CHILD_SUBREAPER = 36
ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
with open(sys.argv[1], "w") as pid_file:
    pid_file.write(f"{os.getpid()}\n")
running = {subprocess.Popen([daemon]).pid for daemon in sys.argv[2:]}
while running:
    pid, _status = os.wait()  # reaps QEMU processes re-parented to us as well
    running.discard(pid)
PY
}

wait_until_answering() {
    local deadline=$((SECONDS + WAIT_SECONDS))
    until answers; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "libvirtd did not answer on $URI within ${WAIT_SECONDS}s; see $LOG" >&2
            exit 1
        fi
        sleep 1
    done
}

drop_running_nat_network() {
    # A daemon started before this script ran may have brought `default` up already.
    if timeout 10 virsh -c "$URI" net-info default >/dev/null 2>&1; then
        timeout 30 virsh -c "$URI" net-destroy default >/dev/null 2>&1 || true
        timeout 30 virsh -c "$URI" net-undefine default >/dev/null
    fi
}

install_packages
forget_nat_network
open_kvm_to_group
answers || start_daemon
wait_until_answering
drop_running_nat_network
virsh -c "$URI" version
