#!/usr/bin/env bash
# Build (or reuse) the cached Debian bookworm roots of one architecture: the build root and the
# device root (see common.sh).
#
#   scripts/emulated/rootfs.sh arm64|arm32          # build if missing, print the build root's path
#   scripts/emulated/rootfs.sh arm64|arm32 --force  # rebuild
#
# Steps: debootstrap --arch=arm64|armhf (both stages in one go: binfmt_misc hands every foreign
# binary to qemu-user-static, so the second stage just runs), apt-get install the device packages,
# a copy of that as the device root, then apt-get install the build packages into the build root.
# Both are marked ready only when every step succeeded; a half-built directory is removed and
# rebuilt on the next run.  Mounts (ours, and debootstrap's own /proc and /sys if it dies half-way)
# are undone on every exit path.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
source "$here/common.sh"

# One function, read completely before it runs: editing this file during a build cannot change
# what that build does.
main() {
    emu_setup "${1:-}"
    force=0
    [ "${2:-}" = "--force" ] && force=1

    need_root
    ensure_host_tools
    ensure_binfmt

    if [ "$force" = 0 ] && [ -e "$EMU_READY" ] && [ -d "$EMU_DEVICE" ]; then
        log "cached root filesystems: $EMU_ROOTFS (+ device root $(basename "$EMU_DEVICE"))"
        echo "$EMU_ROOTFS"
        exit 0
    fi

    mkdir -p "$EMU_CACHE"
    exec 9>"$EMU_CACHE/.lock"
    flock 9
    if [ "$force" = 0 ] && [ -e "$EMU_READY" ] && [ -d "$EMU_DEVICE" ]; then
        echo "$EMU_ROOTFS"; exit 0
    fi

    # Older stamps are dead weight: keep only the ones being built.
    for old in "$EMU_CACHE"/rootfs-* "$EMU_CACHE"/device-*; do
        [ -e "$old" ] || continue
        umount_stale "$old"
        rm -rf "$old"
    done

    trap 'umount_chroot; umount_stale "$EMU_ROOTFS"' EXIT
    trap 'exit 130' INT TERM

    t0=$SECONDS
    log "debootstrap $EMU_SUITE $EMU_DEB_ARCH from $EMU_MIRROR into $EMU_ROOTFS"
    debootstrap --arch="$EMU_DEB_ARCH" --variant=minbase \
        "$EMU_SUITE" "$EMU_ROOTFS" "$EMU_MIRROR" \
        > "$EMU_CACHE/debootstrap.log" 2>&1 \
        || { tail -n 30 "$EMU_CACHE/debootstrap.log" >&2; \
             tail -n 30 "$EMU_ROOTFS/debootstrap/debootstrap.log" >&2 2>/dev/null || true; \
             die "debootstrap failed"; }
    t1=$SECONDS
    log "debootstrap done in $((t1 - t0)) s"

    cat > "$EMU_ROOTFS/etc/apt/sources.list" <<SRC
deb $EMU_MIRROR $EMU_SUITE main
deb $EMU_MIRROR $EMU_SUITE-updates main
SRC
    # No man pages or docs: smaller and faster under emulation.
    cat > "$EMU_ROOTFS/etc/dpkg/dpkg.cfg.d/01-nodoc" <<'NODOC'
path-exclude /usr/share/doc/*
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
NODOC
    echo 'APT::Install-Recommends "false";' > "$EMU_ROOTFS/etc/apt/apt.conf.d/01-norecommends"

    mount_chroot "$EMU_ROOTFS"
    copy_ca_certs "$EMU_ROOTFS"
    in_chroot "$EMU_ROOTFS" apt-get update -qq
    log "apt-get install (device) ${EMU_DEVICE_PACKAGES[*]}"
    in_chroot "$EMU_ROOTFS" apt-get install -y -qq "${EMU_DEVICE_PACKAGES[@]}" \
        > "$EMU_CACHE/apt.log" 2>&1 \
        || { tail -n 40 "$EMU_CACHE/apt.log" >&2; die "apt-get install (device packages) failed"; }
    in_chroot "$EMU_ROOTFS" apt-get clean
    umount_chroot
    # the device root: this state, without apt's package lists (a device's would be its own)
    cp -a "$EMU_ROOTFS" "$EMU_DEVICE.tmp"
    rm -rf "$EMU_DEVICE.tmp"/var/lib/apt/lists/* "$EMU_DEVICE.tmp/debootstrap"
    t2=$SECONDS
    log "device root in $((t2 - t1)) s ($(du -sm "$EMU_DEVICE.tmp" | cut -f1) MB)"

    mount_chroot "$EMU_ROOTFS"
    log "apt-get install (build) ${EMU_BUILD_PACKAGES[*]}"
    in_chroot "$EMU_ROOTFS" apt-get install -y -qq "${EMU_BUILD_PACKAGES[@]}" \
        >> "$EMU_CACHE/apt.log" 2>&1 \
        || { tail -n 40 "$EMU_CACHE/apt.log" >&2; die "apt-get install (build packages) failed"; }
    # ca-certificates' postinst ran update-ca-certificates with the host's certificates already in
    # place: record that, so runs skip the (slow) redo.
    echo "${EMU_CA_SUM:-}" > "$EMU_ROOTFS/etc/ssl/.minirt-host-ca.sha256"
    in_chroot "$EMU_ROOTFS" apt-get clean
    t3=$SECONDS
    log "build packages in $((t3 - t2)) s"
    umount_chroot

    mv "$EMU_DEVICE.tmp" "$EMU_DEVICE"
    {
        echo "stamp=$EMU_STAMP"
        echo "arch=$EMU_DEB_ARCH"
        echo "suite=$EMU_SUITE"
        echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
        echo "debootstrap_seconds=$((t1 - t0))"
        echo "device_apt_seconds=$((t2 - t1))"
        echo "build_apt_seconds=$((t3 - t2))"
    } > "$EMU_READY"
    log "root filesystems ready in $((t3 - t0)) s: $EMU_ROOTFS, $EMU_DEVICE"
    echo "$EMU_ROOTFS"
}

main "$@"
exit
