# Shared settings and helpers of the emulated Raspberry Pi roots (sourced, not executed).
#
# An emulated Pi is a Debian bookworm root filesystem of a foreign architecture run through
# qemu-user-static (binfmt_misc) and chroot.  Two architectures, the same code:
#
#   arm64  Debian arm64 (Raspberry Pi OS 64-bit), qemu-aarch64, cache /var/cache/minirt-arm64
#   arm32  Debian armhf (Raspberry Pi OS 32-bit on a Pi 2 and later: ARMv7 + VFPv3-d16 is Debian's
#          baseline, NEON optional), qemu-arm, cache /var/cache/minirt-arm32
#
# Each cache holds two roots made from one debootstrap, keyed by a stamp of everything that goes into
# them (a changed suite, mirror or package list builds fresh ones):
#
#   rootfs-<suite>-<stamp>  the BUILD root: Debian's python3, numpy, gcc, python3-dev, cffi, pip,
#                           pytest.  The wheel is compiled here and the test subset runs here.
#   device-<suite>-<stamp>  the DEVICE root, a pristine copy taken before the build packages went in:
#                           python3, Debian's numpy and python3-venv, NO compiler.  Never changed; each
#                           run works on a fresh copy of it (device-run) and installs a `minirt
#                           package` there the way a Pi user does.
#
# Usage (the scripts in this folder, and the thin wrappers in scripts/arm64/ and scripts/arm32/):
#   source common.sh; emu_setup arm64|arm32
# Every setting may be overridden per architecture: MINIRT_ARM64_CACHE, MINIRT_ARM32_SUITE, ...

log() { printf '[%s %s] %s\n' "${EMU_NAME:-emu}" "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# The value of MINIRT_<ARCH>_<name>, else the default: emu_env NAME DEFAULT
emu_env() {
    local var="MINIRT_${EMU_VAR}_$1"
    printf '%s' "${!var:-$2}"
}

emu_setup() {
    case "${1:-}" in
        arm64|aarch64)
            EMU_NAME=arm64 EMU_VAR=ARM64 EMU_DEB_ARCH=arm64 EMU_QEMU=aarch64 EMU_MACHINE=aarch64
            EMU_WHEEL_TAG=aarch64
            # qemu CPU -> Pi, for the per-CPU dispatch report (the first one is the main run's default)
            EMU_CPUS=(cortex-a72:rpi4 cortex-a53:rpi3 cortex-a76:rpi5)
            EMU_PACKAGE_TARGET=rpi4
            ;;
        arm32|armhf|armv7l)
            EMU_NAME=arm32 EMU_VAR=ARM32 EMU_DEB_ARCH=armhf EMU_QEMU=arm EMU_MACHINE=armv7l
            EMU_WHEEL_TAG=armv7l
            # cortex-a7: the Pi 2's core (ARMv7, VFPv4, NEON), and what a Pi 3/4 running a 32-bit OS
            # reports as far as the kernels care; cortex-a15: the same features, another core;
            # cortex-a8: NEON without VFPv4 (so no fused multiply-add): the kernels stay on the baseline
            EMU_CPUS=(cortex-a7:rpi2 cortex-a15:a15 cortex-a8:a8)
            EMU_PACKAGE_TARGET=rpi3-armhf
            ;;
        *) die "unknown architecture '${1:-}' (arm64 or arm32)" ;;
    esac
    EMU_CACHE="$(emu_env CACHE "/var/cache/minirt-$EMU_NAME")"
    EMU_SUITE="$(emu_env SUITE bookworm)"
    EMU_MIRROR="$(emu_env MIRROR http://deb.debian.org/debian)"

    # The device: what a Raspberry Pi OS user has after `sudo apt install python3-venv python3-numpy`
    # (the line of a package's README.txt, builder/package.py).  Debian's numpy (1.24) is the point:
    # minirt is installed with --no-deps, so pip never replaces it.  python3-cffi-backend: the
    # compiled kernels load through cffi's _cffi_backend module (see docs/packaging.md).
    EMU_DEVICE_PACKAGES=(python3 python3-numpy python3-venv python3-cffi-backend)
    # The build root adds what compiling the kernels and running the test subset need: what
    # `sudo apt install python3-numpy python3-cffi python3-dev gcc python3-pip` gives, plus pytest.
    EMU_BUILD_PACKAGES=(
        ca-certificates python3-cffi python3-dev gcc libc6-dev
        python3-pip python3-pytest python3-setuptools python3-wheel
    )
    # Bump when the way the roots are made changes.
    EMU_RECIPE_VERSION=2

    EMU_STAMP="$(printf '%s\n' "$EMU_RECIPE_VERSION" "$EMU_DEB_ARCH" "$EMU_SUITE" "$EMU_MIRROR" \
        "${EMU_DEVICE_PACKAGES[*]}" "${EMU_BUILD_PACKAGES[*]}" | sha256sum | cut -c1-12)"
    EMU_ROOTFS="$EMU_CACHE/rootfs-$EMU_SUITE-$EMU_STAMP"
    EMU_DEVICE="$EMU_CACHE/device-$EMU_SUITE-$EMU_STAMP"
    EMU_READY="$EMU_ROOTFS/.minirt-rootfs-ready"
    EMU_MOUNTS=()
}

need_root() {
    [ "$(id -u)" -eq 0 ] || die "must run as root (debootstrap, mount and chroot need it)"
}

# --- binfmt: make the kernel run the foreign ELF files through qemu -------------
ensure_host_tools() {
    local missing=()
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    command -v "qemu-$EMU_QEMU-static" >/dev/null || missing+=(qemu-user-static)
    command -v update-binfmts >/dev/null || missing+=(binfmt-support)
    if [ "${#missing[@]}" -gt 0 ]; then
        log "installing host packages: ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq qemu-user-static binfmt-support debootstrap >/dev/null
    fi
}

ensure_binfmt() {
    local dir=/proc/sys/fs/binfmt_misc handler="qemu-$EMU_QEMU"
    if [ ! -e "$dir/register" ]; then
        log "mounting binfmt_misc"
        mount -t binfmt_misc binfmt_misc "$dir" \
            || die "cannot mount binfmt_misc (a container may need --privileged)"
    fi
    if [ ! -e "$dir/$handler" ]; then
        log "registering the $handler binfmt handler"
        update-binfmts --import "$handler" >/dev/null 2>&1 || true
        update-binfmts --enable "$handler" >/dev/null 2>&1 || true
    fi
    [ -e "$dir/$handler" ] || die "no $handler binfmt handler (install qemu-user-static)"
    grep -q '^enabled' "$dir/$handler" \
        || update-binfmts --enable "$handler" \
        || die "$handler binfmt handler is disabled"
    grep -q '^enabled' "$dir/status" || echo 1 > "$dir/status"
    # Without the F (fix-binary) flag the interpreter must exist inside the chroot at the same
    # path; copying it in covers both cases.
    if ! grep -q '^flags:.*F' "$dir/$handler"; then
        EMU_NEEDS_QEMU_COPY=1
    fi
}

# --- mounts, always undone by the caller's trap ---------------------------------
mount_chroot() {
    local root="$1" m
    for m in proc sys dev dev/pts; do
        mkdir -p "$root/$m"
    done
    mount -t proc proc "$root/proc" && EMU_MOUNTS+=("$root/proc")
    mount --rbind /sys "$root/sys" && mount --make-rslave "$root/sys" && EMU_MOUNTS+=("$root/sys")
    mount --bind /dev "$root/dev" && EMU_MOUNTS+=("$root/dev")
    mount --bind /dev/pts "$root/dev/pts" && EMU_MOUNTS+=("$root/dev/pts")
    if [ -n "${EMU_NEEDS_QEMU_COPY:-}" ]; then
        local interp
        interp="$(sed -n 's/^interpreter //p' "/proc/sys/fs/binfmt_misc/qemu-$EMU_QEMU")"
        mkdir -p "$root$(dirname "$interp")"
        cp "$interp" "$root$interp"
    fi
}

# Unmount in reverse order; lazy unmount as a last resort so a busy mount never outlives the run.
# Safe to call twice.
umount_chroot() {
    local i m
    for ((i=${#EMU_MOUNTS[@]}-1; i>=0; i--)); do
        m="${EMU_MOUNTS[$i]}"
        if mountpoint -q "$m"; then
            umount -R "$m" 2>/dev/null || umount -R -l "$m" 2>/dev/null || log "could not unmount $m"
        fi
    done
    EMU_MOUNTS=()
}

# Any mount left below $root by an earlier run that was killed hard.
umount_stale() {
    local root="$1" m
    while read -r m; do
        umount -R -l "$m" 2>/dev/null || true
    done < <(awk -v r="$root/" 'index($2, r) == 1 {print $2}' /proc/mounts | sort -r)
}

# The host's locally added CA certificates into the chroot, so pip inside reaches the package
# index through an intercepting proxy.  Sets EMU_CA_CHANGED=1 when they differ from what the
# chroot last got: only then is update-ca-certificates (slow under emulation) worth running.
copy_ca_certs() {
    local root="$1" stamp="$1/etc/ssl/.minirt-host-ca.sha256" sum
    mkdir -p "$root/usr/local/share/ca-certificates" "$root/etc/ssl"
    if [ -d /usr/local/share/ca-certificates ]; then
        cp -r /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/"
    fi
    sum="$(cd "$root/usr/local/share/ca-certificates" && find . -type f -print0 | sort -z \
        | xargs -0 -r sha256sum | sha256sum | cut -c1-64)"
    EMU_CA_CHANGED=0
    if [ "$(cat "$stamp" 2>/dev/null)" != "$sum" ]; then
        EMU_CA_CHANGED=1
        EMU_CA_SUM="$sum"
    fi
    cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
}

# update-ca-certificates inside when copy_ca_certs found new certificates.
update_ca_certs() {
    local root="$1"
    [ "${EMU_CA_CHANGED:-1}" = 1 ] || return 0
    if in_chroot "$root" update-ca-certificates >/dev/null 2>&1; then
        echo "$EMU_CA_SUM" > "$root/etc/ssl/.minirt-host-ca.sha256"
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

# The files git knows about (tracked or new, not ignored) of checkout $1 -> folder $2: the checkout
# as pip would get it.
copy_checkout() {
    local repo="$1" dest="$2"
    mkdir -p "$dest"
    if git -C "$repo" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        (cd "$repo" && git ls-files -co --exclude-standard -z \
            | while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done \
            | tar --null -T - -cf -) | tar -xf - -C "$dest"
    else
        tar -C "$repo" --exclude=.venv --exclude=.git --exclude=build --exclude=dist --exclude='*.egg-info' \
            --exclude='_kernels*.so' --exclude=__pycache__ -cf - . | tar -xf - -C "$dest"
    fi
    find "$dest" -name __pycache__ -type d -prune -exec rm -rf {} +
}

# Build the device wheel (MINIRT_WHEEL=runtime, setup.py) inside the build root, with Debian's gcc,
# setuptools and cffi (no network: --no-build-isolation), from the checkout staged at /opt/minirt/src;
# it lands in $root/opt/minirt/dist.  Prints nothing on stdout; sets EMU_WHEEL (host path) and
# EMU_WHEEL_SECONDS.  The chroot must be mounted.
build_wheel_inside() {
    local root="$1" t0 log_file="$EMU_CACHE/pip-wheel.log"
    rm -rf "$root/opt/minirt/dist" "$root/opt/minirt/src/build"
    mkdir -p "$root/opt/minirt/dist"
    log "pip wheel (MINIRT_WHEEL=runtime) inside the $EMU_DEB_ARCH build root: compiles the kernels with Debian's gcc"
    t0=$SECONDS
    if ! in_chroot "$root" env MINIRT_WHEEL=runtime python3 -m pip wheel -v --no-deps --no-build-isolation \
            --no-cache-dir --disable-pip-version-check --no-input -w /opt/minirt/dist /opt/minirt/src \
            > "$log_file" 2>&1; then
        tail -n 60 "$log_file" >&2
        die "pip wheel failed inside the $EMU_DEB_ARCH root (log: $log_file)"
    fi
    EMU_WHEEL_SECONDS=$((SECONDS - t0))
    grep -E "building '|warning: building|error:|failed" "$log_file" | sed 's/^/  pip: /' | cut -c1-240 | head -n 10 >&2 || true
    EMU_WHEEL="$(ls "$root"/opt/minirt/dist/minirt-*.whl 2>/dev/null | head -n 1)"
    [ -n "$EMU_WHEEL" ] || die "pip wheel made no minirt-*.whl (log: $log_file)"
    # A wheel without the compiled module would install and run at numpy speed: refuse it.
    python3 - "$EMU_WHEEL" <<'PY' || die "the wheel has no compiled kernels (log: $log_file)"
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
sys.exit(0 if any(n.startswith("minirt/native/_kernels") and n.endswith(".so") for n in names) else 1)
PY
    rm -rf "$root/opt/minirt/src/build"
    log "wheel built in ${EMU_WHEEL_SECONDS} s: $(basename "$EMU_WHEEL") ($(stat -c %s "$EMU_WHEEL") bytes)"
}
