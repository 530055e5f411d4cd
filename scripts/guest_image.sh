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
# mounting anything, converted to a compressed qcow2.
#
# `guest_image.sh VARIANT` builds instead a guest born on one hardware set: its initramfs holds
# that set's storage and NIC drivers and no others (no virtio unless the set is virtio, no
# agent), the way a host-only initramfs does, so it boots only where those drivers reach its
# disk. Its /init also prints which driver reached the disk (the block device whose sector
# 2047 holds the marker written there at build time) and which NIC got a DHCP address:
#   PYRIGAUD-DISK ok driver=<module>   (or PYRIGAUD-DISK none)
#   PYRIGAUD-NET ok ip=<address> driver=<module>   (or PYRIGAUD-NET none)
# The variants: pvscsi (vmw_pvscsi + vmxnet3), lsisas (mptsas + e1000e), ahci (ahci + e1000),
# virtio (virtio_blk + virtio_net), all booted by syslinux through the BIOS, and uefi (virtio
# drivers) on a GPT disk with an EFI system partition and no BIOS boot code at all, booted by
# syslinux.efi as the removable-media loader \EFI\BOOT\BOOTX64.EFI.
#
# Each result is cached under a key made of the variant, this script and the package versions,
# in a directory QEMU's user can read (0644 file, 0755 directories: libvirt takes ownership of
# backing files). Prints the image path last.
set -euo pipefail

CACHE_DIR=${PYRIGAUD_GUEST_CACHE:-/var/cache/pyrigaud/guest}
BUILD_TOOLS=(syslinux syslinux-common syslinux-efi mtools dosfstools fdisk qemu-utils cpio gzip)
# The build tools whose files land on the disk (boot code, loaders): part of the cache key.
BOOT_CODE_PACKAGES=(syslinux syslinux-common syslinux-efi)
# qemu-ga's libraries, present on the host so that they can be copied into the initramfs.
AGENT_LIBRARIES=(libglib2.0-0 libnuma1 liburing2 libudev1)
GUEST_PACKAGES=(busybox-static qemu-guest-agent)
# The initramfs's modules (their dependencies come along): virtio devices, the power button
# and its input events, the SATA (q35) and IDE (pc) cdrom, and the seed's filesystem.
DEFAULT_MODULES=(virtio_pci virtio_blk virtio_net virtio_console virtio_balloon button evdev
    ahci ata_piix sr_mod isofs)
# What every variant has besides its hardware set's drivers: the power button and its input
# events, and a cdrom on the set's own controller for the seed.
VARIANT_COMMON_MODULES=(button evdev sr_mod isofs)
DISK_MIB=64
PARTITION_START_SECTOR=2048 # 1 MiB
# A variant's disk marker sits in the sector before its partition, unused by MBR and GPT alike.
DISK_MARKER_SECTOR=$((PARTITION_START_SECTOR - 1))
ESP_MIB=60 # GPT keeps a backup table at the disk's end: the partition stops short of it

# A variant's storage and NIC drivers (sd_mod: SCSI and SATA disks are sd devices).
variant_modules() {
    case $1 in
        default) echo "${DEFAULT_MODULES[@]}" ;;
        pvscsi) echo vmw_pvscsi sd_mod vmxnet3 "${VARIANT_COMMON_MODULES[@]}" ;;
        lsisas) echo mptsas sd_mod e1000e "${VARIANT_COMMON_MODULES[@]}" ;;
        ahci) echo ahci sd_mod e1000 "${VARIANT_COMMON_MODULES[@]}" ;;
        virtio | uefi) echo virtio_pci virtio_blk virtio_net "${VARIANT_COMMON_MODULES[@]}" ;;
        *)
            echo "unknown variant $1 (default, pvscsi, lsisas, ahci, virtio, uefi)" >&2
            exit 2
            ;;
    esac
}

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

# The host packages whose libraries qemu-ga's copy takes along: the agent libraries, libc6, and
# what they depend on (glib's libpcre2, libffi, libmount, ...), as installed here.
copied_library_packages() {
    apt-cache depends --recurse --installed --no-recommends --no-suggests --no-conflicts \
        --no-breaks --no-replaces --no-enhances "${AGENT_LIBRARIES[@]}" libc6 \
        | grep -v '^ ' | sort -u
}

cache_key() {
    local variant=$1 packages=$2
    {
        cat "$0"
        echo "$variant"
        echo "$packages"
        # shellcheck disable=SC2046 # one argument per package
        dpkg-query -W -f='${Package}=${Version}\n' $(copied_library_packages) \
            "${BOOT_CODE_PACKAGES[@]}"
    } | sha256sum | cut -c1-16
}

main() {
    local variant=${1:-default}
    variant_modules "$variant" >/dev/null # an unknown name fails before anything is built
    install_build_tools
    local packages key image
    packages=$(pinned_packages)
    key=$(cache_key "$variant" "$packages")
    image="$CACHE_DIR/$variant-$key.qcow2"
    if [ -f "$image" ]; then
        echo "$image"
        return
    fi
    WORK=$(mktemp -d)
    trap 'rm -rf "$WORK"' EXIT
    chmod 0755 "$WORK" # apt's download user writes here
    # shellcheck disable=SC2086 # one argument per package
    (cd "$WORK" && apt-get download -qq -o APT::Sandbox::User=root $packages)
    build_image "$WORK" "$variant"
    mkdir -p "$CACHE_DIR"
    chmod 0755 "$(dirname "$CACHE_DIR")" "$CACHE_DIR"
    install -m 0644 "$WORK/guest.qcow2" "$image.partial"
    mv "$image.partial" "$image"
    # The variant's older builds go: tests copy or back onto the image, nothing keeps its file.
    find "$CACHE_DIR" -maxdepth 1 -name "$variant-*.qcow2*" ! -name "$variant-$key.qcow2" -delete
    echo "$image"
}

build_image() {
    local work=$1 variant=$2
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
    # shellcheck disable=SC2046 # one argument per module
    copy_modules "$busybox" "$unpacked" "$root" "$kernel_version" $(variant_modules "$variant")
    write_guest_scripts "$root"
    if [ "$variant" = default ]; then
        copy_agent "$unpacked" "$root"
    else
        disk_marker "$variant" >"$root/etc/disk-marker"
        write_hardware_report "$root"
    fi
    (cd "$root" && find . | cpio --quiet -o -H newc -R 0:0) | gzip -9 >"$work/initrd.gz"

    local kernel="$unpacked/boot/vmlinuz-$kernel_version"
    if [ "$variant" = uefi ]; then
        write_uefi_disk "$work" "$kernel" "$work/initrd.gz"
    else
        write_disk "$work" "$kernel" "$work/initrd.gz"
    fi
    [ "$variant" = default ] || write_disk_marker "$work/disk.raw" "$variant"
    qemu-img convert -c -f raw -O qcow2 "$work/disk.raw" "$work/guest.qcow2"
}

disk_marker() {
    printf 'PYRIGAUD-TEST-DISK variant=%s' "$1"
}

write_disk_marker() {
    local disk=$1 variant=$2
    disk_marker "$variant" | dd of="$disk" bs=512 seek="$DISK_MARKER_SECTOR" conv=notrunc \
        status=none
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
    shift 4
    local modules=("$@")
    local tree="$unpacked/lib/modules/$version"
    "$busybox" depmod -b "$unpacked" "$version"
    local module path
    for module in "${modules[@]}"; do
        # modules.dep: "kernel/.../name.ko: dependency.ko ..."
        grep -E "(^|/)$module\.ko:" "$tree/modules.dep" | tr -d ':' | tr ' ' '\n'
    done | sort -u | while read -r path; do
        [ -n "$path" ] || continue
        mkdir -p "$root/lib/modules/$version/$(dirname "$path")"
        cp "$tree/$path" "$root/lib/modules/$version/$path"
    done
    cp "$tree/modules.builtin" "$tree/modules.order" "$root/lib/modules/$version/"
    "$busybox" depmod -b "$root" "$version"
    printf '%s\n' "${modules[@]}" >"$root/etc/modules"
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

# A hardware variant reports which drivers reached its disk and its network.
if [ -x /sbin/report-hardware ]; then
    report-hardware disk >/run/disk.found &
    report-hardware net >/run/net.found &
fi

agent_port=""
[ -x /usr/sbin/qemu-ga ] && for attempt in $(seq 20); do
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
    cat /run/*.found
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

# /sbin/report-hardware disk|net: the PYRIGAUD-DISK or PYRIGAUD-NET marker, once found (or
# "none" after a generous bound: a SCSI scan and a DHCP exchange under TCG take seconds).
write_hardware_report() {
    local root=$1
    cat >"$root/sbin/report-hardware" <<EOF
#!/bin/sh
marker_sector=$DISK_MARKER_SECTOR
EOF
    cat >>"$root/sbin/report-hardware" <<'EOF'
marker=$(cat /etc/disk-marker)
attempts=60

# The module of the first driver up a sysfs device's path, past sd (the SCSI disk driver
# every SCSI and SATA controller shares): the controller's or the NIC's own.
driver_of() {
    device=$(readlink -f "$1")
    while [ "${device#/sys/devices/}" != "$device" ]; do
        if [ -e "$device/driver" ]; then
            driver=$(basename "$(readlink -f "$device/driver")")
            if [ "$driver" != sd ]; then
                if [ -e "$device/driver/module" ]; then
                    basename "$(readlink -f "$device/driver/module")"
                else
                    echo "$driver" # built into the kernel
                fi
                return
            fi
        fi
        device=${device%/*}
    done
    echo unknown
}

disk() {
    for attempt in $(seq $attempts); do
        for block in /sys/block/sd* /sys/block/vd* /sys/block/nvme*; do
            [ -e "$block" ] || continue
            found=$(dd if="/dev/${block##*/}" bs=512 skip="$marker_sector" count=1 2>/dev/null \
                | head -c ${#marker})
            if [ "$found" = "$marker" ]; then
                echo "PYRIGAUD-DISK ok driver=$(driver_of "$block/device")"
                return
            fi
        done
        sleep 1
    done
    echo "PYRIGAUD-DISK none"
}

net() {
    for attempt in $(seq $attempts); do
        for nic in /sys/class/net/*; do
            [ "${nic##*/}" = lo ] && continue
            address=$(ip -4 addr show dev "${nic##*/}" | sed -n 's/^ *inet \([0-9.]*\).*/\1/p')
            if [ -n "$address" ]; then
                echo "PYRIGAUD-NET ok ip=$address driver=$(driver_of "$nic/device")"
                return
            fi
        done
        sleep 1
    done
    echo "PYRIGAUD-NET none"
}

"$1"
EOF
    chmod 0755 "$root/sbin/report-hardware"
}

write_syslinux_config() {
    cat >"$1" <<'EOF'
SERIAL 0 115200
DEFAULT guest
PROMPT 0
TIMEOUT 0
LABEL guest
  KERNEL /vmlinuz
  INITRD /initrd.gz
  APPEND console=ttyS0,115200 quiet panic=10
EOF
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
    write_syslinux_config "$work/syslinux.cfg"
    export MTOOLS_SKIP_CHECK=1
    mcopy -i "$disk@@1M" "$kernel" ::/vmlinuz
    mcopy -i "$disk@@1M" "$initrd" ::/initrd.gz
    mcopy -i "$disk@@1M" "$work/syslinux.cfg" ::/syslinux.cfg
}


# GPT, one EFI system partition, and a protective MBR whose boot code stays zero: only UEFI
# firmware boots it, through the removable-media path \EFI\BOOT\BOOTX64.EFI, where
# syslinux.efi finds its ldlinux.e64 and syslinux.cfg beside it.
write_uefi_disk() {
    local work=$1 kernel=$2 initrd=$3
    local disk="$work/disk.raw"
    truncate -s "${DISK_MIB}M" "$disk"
    printf 'label: gpt\nstart=%s, size=%sMiB, type=U, name=ESP\n' \
        "$PARTITION_START_SECTOR" "$ESP_MIB" | sfdisk -q "$disk"
    mkfs.vfat -F 16 -n GUEST --offset "$PARTITION_START_SECTOR" "$disk" $((ESP_MIB * 1024)) \
        >/dev/null
    write_syslinux_config "$work/syslinux.cfg"
    export MTOOLS_SKIP_CHECK=1
    local esp="$disk@@1M"
    mmd -i "$esp" ::/EFI ::/EFI/BOOT
    mcopy -i "$esp" /usr/lib/SYSLINUX.EFI/efi64/syslinux.efi ::/EFI/BOOT/BOOTX64.EFI
    mcopy -i "$esp" /usr/lib/syslinux/modules/efi64/ldlinux.e64 ::/EFI/BOOT/ldlinux.e64
    mcopy -i "$esp" "$work/syslinux.cfg" ::/EFI/BOOT/syslinux.cfg
    mcopy -i "$esp" "$kernel" ::/vmlinuz
    mcopy -i "$esp" "$initrd" ::/initrd.gz
}

main "$@"
