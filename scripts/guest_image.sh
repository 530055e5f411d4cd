#!/usr/bin/env bash
# The tiny bootable test guest for the real-QEMU end-to-end tests; idempotent, builds as root.
#
# Made from Debian packages that are downloaded and unpacked, never installed: the release's
# kernel, a static busybox for the initramfs, and qemu-guest-agent (with its shared libraries
# copied from this host, so build on the guest's Debian release). The guest runs from its
# initramfs: /init loads the virtio, ACPI and cdrom modules, DHCPs every NIC, powers off on
# the ACPI power button or the agent's shutdown, runs qemu-ga on org.qemu.guest_agent.0,
# mounts the cloud-init `cidata` seed and keeps printing markers on the serial console:
#   PYRIGAUD-GUEST-READY uptime=<seconds since boot>s
#   PYRIGAUD-SEED user-data-sha256=<hex> meta-data-sha256=<hex>   (or PYRIGAUD-SEED none)
#   PYRIGAUD-POWEROFF via=acpi|agent
# The disk is a 64 MiB MBR image with one FAT16 partition booted by syslinux, built without
# mounting anything, converted to a compressed qcow2. The result is cached under a key made
# of this script and the package versions, in a directory QEMU's user can read (0644 file,
# 0755 directories: libvirt takes ownership of backing files). Prints the image path last.
set -euo pipefail

CACHE_DIR=${PYRIGAUD_GUEST_CACHE:-/var/cache/pyrigaud/guest}
BUILD_TOOLS=(syslinux syslinux-common mtools dosfstools fdisk qemu-utils cpio gzip)
# qemu-ga's libraries, present on the host so that they can be copied into the initramfs.
AGENT_LIBRARIES=(libglib2.0-0 libnuma1 liburing2 libudev1)
GUEST_PACKAGES=(busybox-static qemu-guest-agent)
# The initramfs's modules (their dependencies come along): virtio devices, the power button
# and its input events, the SATA (q35) and IDE (pc) cdrom, and the seed's filesystem.
MODULES=(virtio_pci virtio_blk virtio_net virtio_console virtio_balloon button evdev
    ahci ata_piix sr_mod isofs)
DISK_MIB=64
PARTITION_START_SECTOR=2048 # 1 MiB

installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}

install_build_tools() {
    local missing=()
    for package in "${BUILD_TOOLS[@]}" "${AGENT_LIBRARIES[@]}"; do
        installed "$package" || missing+=("$package")
    done
    [ ${#missing[@]} -eq 0 ] && return
    if [ "$(id -u)" -ne 0 ]; then
        echo "scripts/guest_image.sh: missing ${missing[*]}; run it as root once" >&2
        exit 1
    fi
    echo "installing: ${missing[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
}

candidate_version() {
    apt-cache show --no-all-versions "$1" 2>/dev/null | sed -n 's/^Version: //p' | head -n 1
}

kernel_package() {
    apt-cache depends linux-image-amd64 2>/dev/null \
        | sed -n 's/^ *Depends: \(linux-image-[0-9].*\)$/\1/p' | head -n 1
}

# "name=version" of every package the image is made of; apt's lists are fetched when absent.
pinned_packages() {
    local kernel
    kernel=$(kernel_package)
    if [ -z "$kernel" ]; then
        apt-get update -qq
        kernel=$(kernel_package)
    fi
    [ -n "$kernel" ] || { echo "no linux-image-amd64 in apt's lists" >&2; exit 1; }
    for package in "$kernel" "${GUEST_PACKAGES[@]}"; do
        echo "$package=$(candidate_version "$package")"
    done
}

cache_key() {
    {
        cat "$0"
        echo "$1"
        dpkg-query -W -f='${Package}=${Version}\n' "${AGENT_LIBRARIES[@]}" libc6
    } | sha256sum | cut -c1-16
}

main() {
    install_build_tools
    local packages key image
    packages=$(pinned_packages)
    key=$(cache_key "$packages")
    image="$CACHE_DIR/$key.qcow2"
    if [ -f "$image" ]; then
        echo "$image"
        return
    fi
    WORK=$(mktemp -d)
    trap 'rm -rf "$WORK"' EXIT
    chmod 0755 "$WORK" # apt's download user writes here
    # shellcheck disable=SC2086 # one argument per package
    (cd "$WORK" && apt-get download -qq -o APT::Sandbox::User=root $packages)
    build_image "$WORK"
    mkdir -p "$CACHE_DIR"
    chmod 0755 "$(dirname "$CACHE_DIR")" "$CACHE_DIR"
    install -m 0644 "$WORK/guest.qcow2" "$image.partial"
    mv "$image.partial" "$image"
    # Older builds go: tests import the image into a pool, nothing keeps using the file.
    find "$CACHE_DIR" -maxdepth 1 -name '*.qcow2*' ! -name "$key.qcow2" -delete
    echo "$image"
}

build_image() {
    local work=$1
    local root="$work/root"
    for deb in "$work"/*.deb; do
        dpkg-deb -x "$deb" "$work/unpacked"
    done
    local unpacked="$work/unpacked"
    local kernel_version
    kernel_version=$(basename "$(ls -d "$unpacked"/lib/modules/*)")
    local busybox="$unpacked/bin/busybox"

    mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,dev,proc,sys,run,tmp,mnt/seed,var/log}
    mkdir -p "$root"/etc/acpi/PWRF "$root"/usr/share/udhcpc "$root/lib/modules/$kernel_version"
    ln -s /run "$root/var/run"
    install -m 0755 "$busybox" "$root/bin/busybox"
    copy_agent "$unpacked" "$root"
    copy_modules "$busybox" "$unpacked" "$root" "$kernel_version"
    write_guest_scripts "$root"
    (cd "$root" && find . | cpio --quiet -o -H newc -R 0:0) | gzip -9 >"$work/initrd.gz"

    write_disk "$work" "$unpacked/boot/vmlinuz-$kernel_version" "$work/initrd.gz"
    qemu-img convert -c -f raw -O qcow2 "$work/disk.raw" "$work/guest.qcow2"
}

copy_agent() {
    local unpacked=$1 root=$2
    install -m 0755 "$unpacked/usr/sbin/qemu-ga" "$root/usr/sbin/qemu-ga"
    local library
    for library in $(ldd "$unpacked/usr/sbin/qemu-ga" | grep -o '/[^ ]*'); do
        mkdir -p "$root$(dirname "$library")"
        cp -L "$library" "$root$library"
    done
}

copy_modules() {
    local busybox=$1 unpacked=$2 root=$3 version=$4
    local tree="$unpacked/lib/modules/$version"
    "$busybox" depmod -b "$unpacked" "$version"
    local module path
    for module in "${MODULES[@]}"; do
        # modules.dep: "kernel/.../name.ko: dependency.ko ..."
        grep -E "(^|/)$module\.ko:" "$tree/modules.dep" | tr -d ':' | tr ' ' '\n'
    done | sort -u | while read -r path; do
        [ -n "$path" ] || continue
        mkdir -p "$root/lib/modules/$version/$(dirname "$path")"
        cp "$tree/$path" "$root/lib/modules/$version/$path"
    done
    cp "$tree/modules.builtin" "$tree/modules.order" "$root/lib/modules/$version/"
    "$busybox" depmod -b "$root" "$version"
    printf '%s\n' "${MODULES[@]}" >"$root/etc/modules"
}

write_guest_scripts() {
    local root=$1
    cat >"$root/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs -o mode=0755 tmpfs /run
exec </dev/console >/dev/console 2>&1

for module in $(cat /etc/modules); do modprobe "$module"; done

acpid -c /etc/acpi -l /run/acpid.log

ip link set lo up
for nic in /sys/class/net/*; do
    name=${nic##*/}
    [ "$name" = lo ] && continue
    ip link set "$name" up
    udhcpc -i "$name" -b -t 10 -T 1 -A 1 -s /usr/share/udhcpc/default.script \
        -p "/run/udhcpc.$name.pid" >/dev/null 2>&1
done

# The seed is the ISO9660 volume labelled cidata (the label sits at byte 32808 of the
# primary volume descriptor; busybox's findfs does not read ISO labels). Looked for in the
# background: the cdrom may show up late, and a guest without one must not wait for it.
iso_label() {
    dd if="$1" bs=1 skip=32808 count=32 2>/dev/null | tr -d ' '
}
find_seed() {
    for attempt in $(seq 20); do
        for device in /dev/sr* /dev/vd*; do
            [ -b "$device" ] && [ "$(iso_label "$device")" = cidata ] || continue
            mount -t iso9660 -o ro "$device" /mnt/seed || continue
            user=$(sha256sum </mnt/seed/user-data | cut -d' ' -f1)
            meta=$(sha256sum </mnt/seed/meta-data | cut -d' ' -f1)
            echo "PYRIGAUD-SEED user-data-sha256=$user meta-data-sha256=$meta"
            return
        done
        sleep 0.5
    done
    echo "PYRIGAUD-SEED none"
}
find_seed >/run/seed.found &

agent_port=""
for attempt in $(seq 20); do
    for port in /sys/class/virtio-ports/*; do
        [ "$(cat "$port/name" 2>/dev/null)" = org.qemu.guest_agent.0 ] && agent_port=/dev/${port##*/}
    done
    [ -n "$agent_port" ] && [ -e "$agent_port" ] && break
    sleep 0.5
done
if [ -n "$agent_port" ]; then
    LD_LIBRARY_PATH=/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu \
        qemu-ga -d -m virtio-serial -p "$agent_port" -t /run -f /run/qemu-ga.pid
fi

# Again and again: a console opened after boot still sees the markers.
ready="PYRIGAUD-GUEST-READY uptime=$(cut -d' ' -f1 /proc/uptime)s"
while :; do
    cat /run/seed.found
    echo "$ready"
    sleep 2
done
EOF
    cat >"$root/etc/acpi/PWRF/00000080" <<'EOF'
#!/bin/sh
echo "PYRIGAUD-POWEROFF via=acpi" >/dev/console
sleep 1 # the serial line drains before the power goes
poweroff -f
EOF
    # qemu-ga's guest-shutdown runs /sbin/shutdown -P|-H|-r +0 "<message>".
    cat >"$root/sbin/shutdown" <<'EOF'
#!/bin/sh
echo "PYRIGAUD-POWEROFF via=agent" >/dev/console
sleep 1 # the serial line drains before the power goes
case " $* " in
    *" -r "*) reboot -f ;;
    *) poweroff -f ;;
esac
EOF
    cat >"$root/usr/share/udhcpc/default.script" <<'EOF'
#!/bin/sh
case "$1" in
    deconfig) ip addr flush dev "$interface" ;;
    bound | renew)
        ifconfig "$interface" "$ip" netmask "${subnet:-255.255.255.0}"
        for gateway in $router; do route add default gw "$gateway" dev "$interface"; done
        ;;
esac
EOF
    chmod 0755 "$root/init" "$root/etc/acpi/PWRF/00000080" "$root/sbin/shutdown" \
        "$root/usr/share/udhcpc/default.script"
}

write_disk() {
    local work=$1 kernel=$2 initrd=$3
    local disk="$work/disk.raw"
    local partition_kib=$(((DISK_MIB * 1024) - (PARTITION_START_SECTOR / 2)))
    truncate -s "${DISK_MIB}M" "$disk"
    echo "start=$PARTITION_START_SECTOR, type=6, bootable" | sfdisk -q "$disk"
    dd if=/usr/lib/syslinux/mbr/mbr.bin of="$disk" bs=440 count=1 conv=notrunc status=none
    mkfs.vfat -F 16 -n GUEST --offset "$PARTITION_START_SECTOR" "$disk" "$partition_kib" \
        >/dev/null
    syslinux --install --offset $((PARTITION_START_SECTOR * 512)) "$disk"
    cat >"$work/syslinux.cfg" <<'EOF'
SERIAL 0 115200
DEFAULT guest
PROMPT 0
TIMEOUT 0
LABEL guest
  KERNEL /vmlinuz
  INITRD /initrd.gz
  APPEND console=ttyS0,115200 quiet panic=10
EOF
    export MTOOLS_SKIP_CHECK=1
    mcopy -i "$disk@@1M" "$kernel" ::/vmlinuz
    mcopy -i "$disk@@1M" "$initrd" ::/initrd.gz
    mcopy -i "$disk@@1M" "$work/syslinux.cfg" ::/syslinux.cfg
}

main "$@"
