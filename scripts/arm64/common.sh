# Shared settings for the scripts in scripts/arm64/ (sourced, not executed).
#
# The emulated Raspberry Pi is a Debian bookworm arm64 root filesystem run
# through qemu-user-static (binfmt_misc) and chroot.  It lives in a cache
# directory outside the checkout, keyed by a stamp of everything that goes
# into it, so a change of suite, mirror or package list builds a fresh one.

MINIRT_ARM64_CACHE="${MINIRT_ARM64_CACHE:-/var/cache/minirt-arm64}"
MINIRT_ARM64_SUITE="${MINIRT_ARM64_SUITE:-bookworm}"
MINIRT_ARM64_MIRROR="${MINIRT_ARM64_MIRROR:-http://deb.debian.org/debian}"

# What Raspberry Pi OS bookworm gives a user who runs
#   sudo apt install python3-numpy python3-cffi python3-dev gcc python3-pip
# plus pytest to run the runtime tests.  Debian's numpy (1.24) is the point:
# minirt is installed with --no-deps so pip never replaces it.
ARM64_PACKAGES=(
    ca-certificates
    python3 python3-numpy python3-cffi python3-dev gcc libc6-dev
    python3-pip python3-pytest python3-setuptools python3-wheel
)

# Bump when the way the root filesystem is made changes.
ARM64_RECIPE_VERSION=1

arm64_stamp() {
    printf '%s\n' "$ARM64_RECIPE_VERSION" "$MINIRT_ARM64_SUITE" \
        "$MINIRT_ARM64_MIRROR" "${ARM64_PACKAGES[*]}" \
        | sha256sum | cut -c1-12
}

ARM64_STAMP="$(arm64_stamp)"
ARM64_ROOTFS="$MINIRT_ARM64_CACHE/rootfs-$MINIRT_ARM64_SUITE-$ARM64_STAMP"
ARM64_READY="$ARM64_ROOTFS/.minirt-rootfs-ready"

log() { printf '[arm64 %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

need_root() {
    [ "$(id -u)" -eq 0 ] || die "must run as root (debootstrap, mount and chroot need it)"
}

# --- binfmt: make the kernel run aarch64 ELF files through qemu ----------
ensure_host_tools() {
    local missing=()
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    command -v qemu-aarch64-static >/dev/null || missing+=(qemu-user-static)
    command -v update-binfmts >/dev/null || missing+=(binfmt-support)
    if [ "${#missing[@]}" -gt 0 ]; then
        log "installing host packages: ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq qemu-user-static binfmt-support debootstrap >/dev/null
    fi
}

ensure_binfmt() {
    local dir=/proc/sys/fs/binfmt_misc
    if [ ! -e "$dir/register" ]; then
        log "mounting binfmt_misc"
        mount -t binfmt_misc binfmt_misc "$dir" \
            || die "cannot mount binfmt_misc (a container may need --privileged)"
    fi
    if [ ! -e "$dir/qemu-aarch64" ]; then
        log "registering the qemu-aarch64 binfmt handler"
        update-binfmts --import qemu-aarch64 >/dev/null 2>&1 || true
        update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
    fi
    [ -e "$dir/qemu-aarch64" ] || die "no qemu-aarch64 binfmt handler (install qemu-user-static)"
    grep -q '^enabled' "$dir/qemu-aarch64" \
        || update-binfmts --enable qemu-aarch64 \
        || die "qemu-aarch64 binfmt handler is disabled"
    grep -q '^enabled' "$dir/status" || echo 1 > "$dir/status"
    # Without the F (fix-binary) flag the interpreter must exist inside the
    # chroot at the same path; copying it in covers both cases.
    if ! grep -q '^flags:.*F' "$dir/qemu-aarch64"; then
        ARM64_NEEDS_QEMU_COPY=1
    fi
}

# --- mounts, always undone by the caller's trap --------------------------
ARM64_MOUNTS=()

mount_chroot() {
    local root="$1" m
    for m in proc sys dev dev/pts; do
        mkdir -p "$root/$m"
    done
    mount -t proc proc "$root/proc" && ARM64_MOUNTS+=("$root/proc")
    mount --rbind /sys "$root/sys" && mount --make-rslave "$root/sys" && ARM64_MOUNTS+=("$root/sys")
    mount --bind /dev "$root/dev" && ARM64_MOUNTS+=("$root/dev")
    mount --bind /dev/pts "$root/dev/pts" && ARM64_MOUNTS+=("$root/dev/pts")
    if [ -n "${ARM64_NEEDS_QEMU_COPY:-}" ]; then
        local interp
        interp="$(sed -n 's/^interpreter //p' /proc/sys/fs/binfmt_misc/qemu-aarch64)"
        mkdir -p "$root$(dirname "$interp")"
        cp "$interp" "$root$interp"
    fi
}

# Unmount in reverse order; lazy unmount as a last resort so a busy mount
# never outlives the run.  Safe to call twice.
umount_chroot() {
    local i m
    for ((i=${#ARM64_MOUNTS[@]}-1; i>=0; i--)); do
        m="${ARM64_MOUNTS[$i]}"
        if mountpoint -q "$m"; then
            umount -R "$m" 2>/dev/null || umount -R -l "$m" 2>/dev/null || log "could not unmount $m"
        fi
    done
    ARM64_MOUNTS=()
}

# Any mount left below $root by an earlier run that was killed hard.
umount_stale() {
    local root="$1" m
    while read -r m; do
        umount -R -l "$m" 2>/dev/null || true
    done < <(awk -v r="$root/" 'index($2, r) == 1 {print $2}' /proc/mounts | sort -r)
}

# The host's locally added CA certificates into the chroot, so pip inside
# reaches the package index through an intercepting proxy.  Sets
# ARM64_CA_CHANGED=1 when they differ from what the chroot last got: only
# then is update-ca-certificates (slow under emulation) worth running.
copy_ca_certs() {
    local root="$1" stamp="$1/etc/ssl/.minirt-host-ca.sha256" sum
    mkdir -p "$root/usr/local/share/ca-certificates" "$root/etc/ssl"
    if [ -d /usr/local/share/ca-certificates ]; then
        cp -r /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/"
    fi
    sum="$(cd "$root/usr/local/share/ca-certificates" && find . -type f -print0 | sort -z \
        | xargs -0 -r sha256sum | sha256sum | cut -c1-64)"
    ARM64_CA_CHANGED=0
    if [ "$(cat "$stamp" 2>/dev/null)" != "$sum" ]; then
        ARM64_CA_CHANGED=1
        ARM64_CA_SUM="$sum"
    fi
    cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
}

# update-ca-certificates inside when copy_ca_certs found new certificates.
update_ca_certs() {
    local root="$1"
    [ "${ARM64_CA_CHANGED:-1}" = 1 ] || return 0
    if in_chroot "$root" update-ca-certificates >/dev/null 2>&1; then
        echo "$ARM64_CA_SUM" > "$root/etc/ssl/.minirt-host-ca.sha256"
    else
        log "update-ca-certificates failed inside (pip may not reach the package index)"
    fi
}

in_chroot() {
    local root="$1"; shift
    chroot "$root" /usr/bin/env -i \
        HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        DEBIAN_FRONTEND=noninteractive \
        ${PIP_INDEX_URL:+PIP_INDEX_URL="$PIP_INDEX_URL"} \
        ${http_proxy:+http_proxy="$http_proxy"} ${https_proxy:+https_proxy="$https_proxy"} \
        "$@"
}
