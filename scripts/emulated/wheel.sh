#!/usr/bin/env bash
# The runtime wheel of one emulated architecture, built inside its build root (`make wheels`).
#
#   scripts/emulated/wheel.sh arm64|arm32 OUT_DIR
#
# Stages the checkout in the build root (rootfs.sh, cached), runs `MINIRT_WHEEL=runtime python3 -m pip
# wheel` there with Debian's python3 3.11, gcc 12, setuptools and cffi (no network), and copies the wheel
# (minirt-<version>-cp311-cp311-linux_aarch64.whl / _armv7l.whl) to OUT_DIR.  Takes the same run lock as
# run-tests.sh: one user of a root at a time.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=common.sh
source "$here/common.sh"

main() {
    emu_setup "${1:-}"
    out="${2:-}"
    [ -n "$out" ] || die "usage: wheel.sh arm64|arm32 OUT_DIR"
    need_root
    mkdir -p "$out"
    out="$(cd "$out" && pwd)"
    t_start=$SECONDS
    "$here/rootfs.sh" "$EMU_NAME" >/dev/null
    ensure_binfmt
    exec 8>"$EMU_CACHE/.run-lock"
    flock -w 3600 8 || die "another run holds $EMU_CACHE/.run-lock"
    root="$EMU_ROOTFS"
    umount_stale "$root"
    trap 'umount_chroot; umount_stale "$root"' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    rm -rf "$root/opt/minirt"
    copy_checkout "$repo" "$root/opt/minirt/src"
    mount_chroot "$root"
    build_wheel_inside "$root"
    umount_chroot
    rm -f "$out"/minirt-*-linux_"$EMU_WHEEL_TAG".whl
    cp "$EMU_WHEEL" "$out/"
    log "$(basename "$EMU_WHEEL"): $(stat -c %s "$EMU_WHEEL") bytes, compiled in ${EMU_WHEEL_SECONDS} s" \
        "(total $((SECONDS - t_start)) s) -> $out"
    echo "$out/$(basename "$EMU_WHEEL")"
}

main "$@"
exit
