#!/usr/bin/env bash
# A shell in an emulated Raspberry Pi (`make arm64-shell`, `make arm32-shell`).
#
#   scripts/emulated/shell.sh arm64|arm32 [--device] [COMMAND...]
#
# Uses the cached build root (built on first use, see rootfs.sh), or with --device a fresh copy of the
# device root (no compiler; thrown away when the shell ends), with /proc, /sys and /dev mounted for the
# session and unmounted when it ends.  What the last test run staged is under /opt/minirt of the build
# root (src, tests, artifacts, packages, dist):
#   cd /opt/minirt/tests && python3 -m pytest -q tests/arm64
#   QEMU_CPU=cortex-a76 python3 -m minirt info      # pretend to be a Pi 5 (arm32: cortex-a7, a Pi 2)
# Any command given runs instead of the shell: scripts/emulated/shell.sh arm64 python3 -m minirt info
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
source "$here/common.sh"

emu_setup "${1:-}"
shift || true
need_root
"$here/rootfs.sh" "$EMU_NAME" >/dev/null
ensure_binfmt
root="$EMU_ROOTFS"
if [ "${1:-}" = "--device" ]; then
    shift
    root="$EMU_CACHE/device-shell-$$"
    cp -a "$EMU_DEVICE" "$root"
    trap 'umount_chroot; umount_stale "$root"; rm -rf "$root"' EXIT
else
    trap 'umount_chroot; umount_stale "$root"' EXIT
fi
umount_stale "$root"
mount_chroot "$root"
copy_ca_certs "$root"
[ "$root" != "$EMU_ROOTFS" ] || update_ca_certs "$root"
log "entering $root (Debian $EMU_SUITE $EMU_DEB_ARCH under qemu-user); exit to leave"
if [ "$#" -gt 0 ]; then
    in_chroot "$root" "$@"
else
    in_chroot "$root" PS1="rpi-$EMU_NAME:\\w# " /bin/bash --norc -i
fi
