#!/usr/bin/env bash
# Build (or reuse) the cached Debian bookworm arm64 root filesystem.
#
#   scripts/arm64/rootfs.sh          # build if missing, print its path
#   scripts/arm64/rootfs.sh --force  # rebuild
#
# Steps: debootstrap --arch=arm64 (both stages in one go: binfmt_misc hands
# every aarch64 binary to qemu-user-static, so the second stage just runs),
# then apt-get install the Pi packages inside.  The result is marked ready
# only when every step succeeded; a half-built directory is removed and
# rebuilt on the next run.  Mounts (ours, and debootstrap's own /proc and
# /sys if it dies half-way) are undone on every exit path.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
source "$here/common.sh"

# One function, read completely before it runs: editing this file during a
# build cannot change what that build does.
main() {
    force=0
    [ "${1:-}" = "--force" ] && force=1

    need_root
    ensure_host_tools
    ensure_binfmt

    if [ "$force" = 0 ] && [ -e "$ARM64_READY" ]; then
        log "cached root filesystem: $ARM64_ROOTFS"
        echo "$ARM64_ROOTFS"
        exit 0
    fi

    mkdir -p "$MINIRT_ARM64_CACHE"
    exec 9>"$MINIRT_ARM64_CACHE/.lock"
    flock 9
    if [ "$force" = 0 ] && [ -e "$ARM64_READY" ]; then
        echo "$ARM64_ROOTFS"; exit 0
    fi

    umount_stale "$ARM64_ROOTFS"
    rm -rf "$ARM64_ROOTFS"
    # Older stamps are dead weight: keep only the one being built.
    for old in "$MINIRT_ARM64_CACHE"/rootfs-*; do
        [ -e "$old" ] || continue
        umount_stale "$old"
        rm -rf "$old"
    done

    trap 'umount_chroot; umount_stale "$ARM64_ROOTFS"' EXIT
    trap 'exit 130' INT TERM

    t0=$SECONDS
    log "debootstrap $MINIRT_ARM64_SUITE arm64 from $MINIRT_ARM64_MIRROR into $ARM64_ROOTFS"
    debootstrap --arch=arm64 --variant=minbase \
        "$MINIRT_ARM64_SUITE" "$ARM64_ROOTFS" "$MINIRT_ARM64_MIRROR" \
        > "$MINIRT_ARM64_CACHE/debootstrap.log" 2>&1 \
        || { tail -n 30 "$MINIRT_ARM64_CACHE/debootstrap.log" >&2; \
             tail -n 30 "$ARM64_ROOTFS/debootstrap/debootstrap.log" >&2 2>/dev/null || true; \
             die "debootstrap failed"; }
    t1=$SECONDS
    log "debootstrap done in $((t1 - t0)) s"

    cat > "$ARM64_ROOTFS/etc/apt/sources.list" <<SRC
deb $MINIRT_ARM64_MIRROR $MINIRT_ARM64_SUITE main
deb $MINIRT_ARM64_MIRROR $MINIRT_ARM64_SUITE-updates main
SRC
    # No man pages or docs: smaller and faster under emulation.
    cat > "$ARM64_ROOTFS/etc/dpkg/dpkg.cfg.d/01-nodoc" <<'NODOC'
path-exclude /usr/share/doc/*
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
NODOC
    echo 'APT::Install-Recommends "false";' > "$ARM64_ROOTFS/etc/apt/apt.conf.d/01-norecommends"

    mount_chroot "$ARM64_ROOTFS"
    copy_ca_certs "$ARM64_ROOTFS"
    log "apt-get install ${ARM64_PACKAGES[*]}"
    in_chroot "$ARM64_ROOTFS" apt-get update -qq
    in_chroot "$ARM64_ROOTFS" apt-get install -y -qq "${ARM64_PACKAGES[@]}" \
        > "$MINIRT_ARM64_CACHE/apt.log" 2>&1 \
        || { tail -n 40 "$MINIRT_ARM64_CACHE/apt.log" >&2; die "apt-get install failed"; }
    # ca-certificates' postinst ran update-ca-certificates with the host's
    # certificates already in place: record that, so runs skip the (slow) redo.
    echo "${ARM64_CA_SUM:-}" > "$ARM64_ROOTFS/etc/ssl/.minirt-host-ca.sha256"
    in_chroot "$ARM64_ROOTFS" apt-get clean
    t2=$SECONDS
    log "apt inside done in $((t2 - t1)) s"
    umount_chroot

    {
        echo "stamp=$ARM64_STAMP"
        echo "suite=$MINIRT_ARM64_SUITE"
        echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
        echo "debootstrap_seconds=$((t1 - t0))"
        echo "apt_seconds=$((t2 - t1))"
    } > "$ARM64_READY"
    log "root filesystem ready in $((t2 - t0)) s: $ARM64_ROOTFS"
    echo "$ARM64_ROOTFS"
}

main "$@"
exit
