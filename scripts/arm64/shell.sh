#!/usr/bin/env bash
# `make arm64-shell`: an interactive shell in the emulated Raspberry Pi.
#
# Uses the cached root filesystem (built on first use, see rootfs.sh), with
# /proc, /sys and /dev mounted for the session and unmounted when it ends.
# What `make test-arm64` staged is under /opt/minirt (src, tests, artifacts):
#   cd /opt/minirt/tests && python3 -m pytest -q tests/arm64
#   QEMU_CPU=cortex-a76 python3 -m minirt info      # pretend to be a Pi 5
# Any command given runs instead of the shell: scripts/arm64/shell.sh python3 -m minirt info
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
source "$here/common.sh"

need_root
"$here/rootfs.sh" >/dev/null
ensure_binfmt
root="$ARM64_ROOTFS"
umount_stale "$root"
trap 'umount_chroot; umount_stale "$root"' EXIT
mount_chroot "$root"
copy_ca_certs "$root"
update_ca_certs "$root"
log "entering $root (Debian $MINIRT_ARM64_SUITE arm64 under qemu-user); exit to leave"
if [ "$#" -gt 0 ]; then
    in_chroot "$root" "$@"
else
    in_chroot "$root" PS1='rpi-emu:\w# ' /bin/bash --norc -i
fi
